package kubernetes

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/squidconf"
)

// Labels and annotations on every Pod this provider creates.
const (
	// LabelManagedBy with value ManagedBy marks a Pod as proxyfleet's; ListByTag
	// and Check select on it, and Get and Delete ignore Pods without it.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedBy is LabelManagedBy's value.
	ManagedBy = "proxyfleet"
	// LabelOwnerUID carries the owning Proxy's UID: the orphan GC's proof of ownership.
	LabelOwnerUID = "proxyfleet.io/uid"
	// LabelInstallation carries the creating controller's installation ID
	// (providers.CreateRequest.Installation): the orphan GC deletes only its
	// own installation's Pods.
	LabelInstallation = "proxyfleet.io/installation"
	// LabelOwnerName carries the owning Proxy's name when it fits in a label
	// value (63 characters); AnnotationOwner always has it.
	LabelOwnerName = "proxyfleet.io/name"
	// LabelAppName identifies the workload for kubectl and dashboards.
	LabelAppName = "app.kubernetes.io/name"
	// AnnotationOwner is "<namespace>/<name>" of the owning Proxy.
	AnnotationOwner = "proxyfleet.io/owner"
	// AnnotationSquidConf holds the generated squid.conf. A downward API volume
	// projects it into the container, so the Pod is the only object per
	// instance: nothing else to create, leak or garbage-collect.
	AnnotationSquidConf = "proxyfleet.io/squid-conf"
)

// Where the container finds things, and who it runs as.
const (
	containerName = "squid"
	confDir       = "/etc/proxyfleet"
	confFile      = "squid.conf"
	squidBinary   = "/usr/sbin/squid"
	// squidUID is the "proxy" user of Debian and Ubuntu images (base-passwd).
	squidUID int64 = 13
)

// buildPod returns the Pod for req. It is pure: everything comes from cfg and
// req. A request no Pod can satisfy is an ErrPermanent naming the field.
func buildPod(cfg Config, req providers.CreateRequest) (*corev1.Pod, error) {
	if err := validateRequest(req); err != nil {
		return nil, fmt.Errorf("%w: %s", providers.ErrPermanent, err)
	}
	image := cfg.Image
	if req.Placement.Image != "" {
		image = req.Placement.Image
	}
	port := int32(req.Port)

	labels := podLabels(req)

	conf := squidconf.Config{
		Name:     req.Name,
		Port:     req.Port,
		Denied:   append(DefaultDeniedDestinations(), cfg.ClusterCIDRs...),
		Admitted: cfg.ClusterTargets,
		Clients:  cfg.clientCIDRs(),
	}

	probe := func(initial, period, timeout, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:        corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}},
			InitialDelaySeconds: initial, PeriodSeconds: period, TimeoutSeconds: timeout, FailureThreshold: failures,
		}
	}

	owner := req.OwnerName
	if req.OwnerNamespace != "" {
		owner = req.OwnerNamespace + "/" + req.OwnerName
	}
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      req.Name,
			Namespace: cfg.Namespace,
			Labels:    labels,
			Annotations: map[string]string{
				AnnotationOwner:     owner,
				AnnotationSquidConf: conf.Render(),
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyAlways,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(10)),
			NodeSelector:                  nodeSelectorFor(req.Placement),
			SecurityContext:               podSecurityFor(port),
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{squidBinary, "-N", "-d", "1", "-f", confDir + "/" + confFile},
				Ports:           []corev1.ContainerPort{{Name: "proxy", ContainerPort: port, Protocol: corev1.ProtocolTCP}},
				ReadinessProbe:  probe(1, 5, 2, 2),
				LivenessProbe:   probe(10, 20, 5, 3),
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{
						corev1.ResourceCPU:    resource.MustParse("20m"),
						corev1.ResourceMemory: resource.MustParse("48Mi"),
					},
					// Squid's worker is single-threaded: a one-CPU limit costs it
					// nothing and satisfies namespaces whose quota demands limits.
					Limits: corev1.ResourceList{
						corev1.ResourceCPU:    resource.MustParse("1"),
						corev1.ResourceMemory: resource.MustParse("256Mi"),
					},
				},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					RunAsNonRoot:             ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "squid-conf", MountPath: confDir, ReadOnly: true},
					{Name: "tmp", MountPath: "/tmp"},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "squid-conf", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
					DefaultMode: ptr.To(int32(0o444)),
					Items: []corev1.DownwardAPIVolumeFile{{
						Path:     confFile,
						FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.annotations['" + AnnotationSquidConf + "']"},
					}},
				}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("16Mi"))}}},
			},
		},
	}
	return pod, nil
}

// podLabels are the request's labels with the provider's own set over
// them; the owner's name only when it is a valid label value.
func podLabels(req providers.CreateRequest) map[string]string {
	labels := map[string]string{}
	for k, v := range req.Labels {
		labels[k] = v
	}
	labels[LabelManagedBy] = ManagedBy
	labels[LabelAppName] = "squid"
	labels[LabelOwnerUID] = req.OwnerUID
	delete(labels, LabelInstallation)
	if req.Installation != "" {
		labels[LabelInstallation] = req.Installation
	}
	delete(labels, LabelOwnerName)
	if req.OwnerName != "" && len(validation.IsValidLabelValue(req.OwnerName)) == 0 {
		labels[LabelOwnerName] = req.OwnerName
	}
	return labels
}

// nodeSelectorFor places the Pod by the placement's zone and machine type
// (node labels); nil when it names neither.
func nodeSelectorFor(pl providers.Placement) map[string]string {
	if pl.Zone == "" && pl.MachineType == "" {
		return nil
	}
	sel := map[string]string{}
	if pl.Zone != "" {
		sel[corev1.LabelTopologyZone] = pl.Zone
	}
	if pl.MachineType != "" {
		sel[corev1.LabelInstanceTypeStable] = pl.MachineType
	}
	return sel
}

// podSecurityFor runs Squid as its own non-root user under the runtime's
// seccomp profile.
func podSecurityFor(port int32) *corev1.PodSecurityContext {
	sc := &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To(squidUID),
		RunAsGroup:     ptr.To(squidUID),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if port < 1024 {
		// A non-root Squid may bind a low port only where the Pod's network
		// namespace allows it; this sysctl is namespaced and "safe" (allowed
		// by every kubelet since 1.22).
		sc.Sysctls = []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}}
	}
	return sc
}

// validateRequest rejects what the API server would reject later, with a
// message naming the request field.
func validateRequest(req providers.CreateRequest) error {
	var problems []string
	if msgs := validation.IsDNS1123Label(req.Name); len(msgs) > 0 {
		problems = append(problems, fmt.Sprintf("name %q is not a DNS-1123 label: %s", req.Name, strings.Join(msgs, "; ")))
	}
	if req.OwnerUID == "" {
		problems = append(problems, "owner UID is required (it is what proves ownership to the orphan GC)")
	} else if msgs := validation.IsValidLabelValue(req.OwnerUID); len(msgs) > 0 {
		problems = append(problems, fmt.Sprintf("owner UID %q is not a label value", req.OwnerUID))
	}
	if msgs := validation.IsValidLabelValue(req.Installation); len(msgs) > 0 {
		problems = append(problems, fmt.Sprintf("installation %q is not a label value", req.Installation))
	}
	if req.Port < 1 || req.Port > 65535 {
		problems = append(problems, fmt.Sprintf("port %d is not in 1-65535", req.Port))
	}
	if img := req.Placement.Image; img != "" && (strings.TrimSpace(img) != img || strings.ContainsAny(img, " \t\n")) {
		problems = append(problems, fmt.Sprintf("placement.image %q is not an image reference", img))
	}
	for field, v := range map[string]string{"placement.zone": req.Placement.Zone, "placement.machineType": req.Placement.MachineType} {
		if v != "" && len(validation.IsValidLabelValue(v)) > 0 {
			problems = append(problems, fmt.Sprintf("%s %q is not a node label value", field, v))
		}
	}
	for k, v := range req.Labels {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			problems = append(problems, fmt.Sprintf("label key %q: %s", k, strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			problems = append(problems, fmt.Sprintf("label %s value %q: %s", k, v, strings.Join(msgs, "; ")))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	sort.Strings(problems)
	return fmt.Errorf("invalid create request: %s", strings.Join(problems, ", "))
}

// stateOf maps a Pod onto the instance states the reconciler acts on.
//
//   - being deleted → Terminated (the reconciler's Delete is then a no-op and
//     it polls until the Pod is gone);
//   - Pending, or no phase yet → Provisioning;
//   - Running with a Pod IP → Running; Running without one → Provisioning;
//   - Succeeded → Terminated; Failed → Stopped (both are final for a Pod:
//     the reconciler deletes and recreates it);
//   - Unknown → Provisioning: the node stopped reporting, which usually heals;
//     deleting would leave the Pod stuck terminating on an unreachable node and
//     block the same-named replacement anyway, so the next poll decides;
//   - any phase Kubernetes adds later → Stopped, the always-safe answer for cattle.
func stateOf(pod *corev1.Pod) providers.State {
	if pod.DeletionTimestamp != nil {
		return providers.StateTerminated
	}
	switch pod.Status.Phase {
	case "", corev1.PodPending, corev1.PodUnknown:
		return providers.StateProvisioning
	case corev1.PodRunning:
		if pod.Status.PodIP == "" {
			return providers.StateProvisioning
		}
		return providers.StateRunning
	case corev1.PodSucceeded:
		return providers.StateTerminated
	default: // corev1.PodFailed and future phases
		return providers.StateStopped
	}
}

// instanceOf describes a managed Pod.
func instanceOf(pod *corev1.Pod) providers.Instance {
	return providers.Instance{
		ProviderID:   formatProviderID(pod.Namespace, pod.Name),
		Name:         pod.Name,
		State:        stateOf(pod),
		IP:           pod.Status.PodIP,
		OwnerUID:     pod.Labels[LabelOwnerUID],
		Installation: pod.Labels[LabelInstallation],
		CreatedAt:    pod.CreationTimestamp.Time,
	}
}

// managed reports whether this provider created pod.
func managed(pod *corev1.Pod) bool { return pod.Labels[LabelManagedBy] == ManagedBy }
