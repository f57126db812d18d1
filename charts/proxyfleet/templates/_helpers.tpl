{{/* The chart's name. */}}
{{- define "proxyfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The resource name prefix: <release>-proxyfleet, or the release when it says proxyfleet already. */}}
{{- define "proxyfleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "proxyfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "proxyfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "proxyfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "proxyfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "proxyfleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "proxyfleet.sidecarImage" -}}
{{ .Values.sidecar.image.repository }}:{{ .Values.sidecar.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "proxyfleet.leaseSecret" -}}
{{- .Values.leaseAPI.existingSecret | default (printf "%s-lease-api-token" (include "proxyfleet.fullname" .)) -}}
{{- end -}}

{{- define "proxyfleet.webhookService" -}}
{{ include "proxyfleet.fullname" . }}-webhook
{{- end -}}

{{- define "proxyfleet.webhookCertSecret" -}}
{{ include "proxyfleet.fullname" . }}-webhook-cert
{{- end -}}

{{/* Cluster-scoped names carry the namespace: two releases must not collide. */}}
{{- define "proxyfleet.webhookConfiguration" -}}
{{ include "proxyfleet.fullname" . }}-inject-{{ .Release.Namespace }}
{{- end -}}

{{- define "proxyfleet.clusterRole" -}}
{{ include "proxyfleet.fullname" . }}-controller-{{ .Release.Namespace }}
{{- end -}}

{{/* The Proxy, ProxyPool and Secret rules: cluster-wide, or a Role in controller.proxyNamespace. */}}
{{- define "proxyfleet.proxyRules" -}}
# The Proxy reconciler (finalizer and spec-hash are patches); the ProxyPool
# reconciler creates and removes its Proxies and patches the drain annotation.
- apiGroups: [proxyfleet.io]
  resources: [proxies]
  verbs: [get, list, watch, create, update, patch, delete]
# The one status writer of Proxies.
- apiGroups: [proxyfleet.io]
  resources: [proxies/status]
  verbs: [get, update, patch]
# The ProxyPool reconciler (its finalizer is a patch).
- apiGroups: [proxyfleet.io]
  resources: [proxypools]
  verbs: [get, list, watch, update, patch]
# Its one status writer.
- apiGroups: [proxyfleet.io]
  resources: [proxypools/status]
  verbs: [get, update, patch]
# The autoscaler sets spec.replicas through /scale, as an HPA does.
- apiGroups: [proxyfleet.io]
  resources: [proxypools/scale]
  verbs: [get, update]
# The lease API reads ProxyGrants (who may lease a namespace's Proxies)...
- apiGroups: [proxyfleet.io]
  resources: [proxygrants]
  verbs: [get, list, watch]
# ...and the ProxyGrant reconciler writes their Resolved condition.
- apiGroups: [proxyfleet.io]
  resources: [proxygrants/status]
  verbs: [get, update, patch]
# Cloud-init Secrets and proxy logins: two caches select on labels, but RBAC
# cannot grant by label, so list/watch cover the watched namespaces' Secrets
# (held in memory only when labelled). create/delete: generated VM logins.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch, create, delete]
{{- end -}}
