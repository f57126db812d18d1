// Package inject is the sidecar injection of proxyfleet: a mutating
// admission webhook that adds a --lease-api gateway beside every crawler pod
// that asks for one (label proxyfleet.io/inject: "true" on the pod or its
// namespace), authenticating to the lease API with the pod's own projected
// service-account token, and points the app containers' HTTP(S)_PROXY at it.
// The mutation (this file) is pure; webhook.go serves it and certs.go keeps
// the webhook's serving certificate and the configuration's caBundle.
//
// It imports pool, pool/leaseapi, rotation and internal/logging for the
// settings it checks; never the reconcilers, gateway or cmd.
package inject

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/proxyfleet/proxyfleet/internal/clustertargets"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Labels and annotations of injection, on pods and namespaces.
const (
	// LabelInject "true" on a pod or its namespace asks for a sidecar; "false"
	// on the pod opts it out of a labelled namespace. A label (not an
	// annotation) so the webhook configuration's selectors can limit the
	// webhook, and failurePolicy Fail, to opted-in pods.
	LabelInject = "proxyfleet.io/inject"
	// AnnotationInjected is set on an injected pod; a pod carrying it (or a
	// container named SidecarName) is never injected again.
	AnnotationInjected = "proxyfleet.io/injected"
	// AnnotationSelector is the sidecar's default lease selector, key=value,...
	AnnotationSelector = "proxyfleet.io/selector"
	// AnnotationRotation is the sidecar's rotation: sticky or request.
	AnnotationRotation = "proxyfleet.io/rotation"
	// AnnotationNoProxy adds comma-separated hosts, domains (.example.com) or
	// CIDRs to the app containers' NO_PROXY.
	AnnotationNoProxy = "proxyfleet.io/no-proxy"
	// AnnotationGatewayResources overrides the sidecar's resources:
	// requests.cpu=50m,requests.memory=32Mi,limits.memory=64Mi.
	AnnotationGatewayResources = "proxyfleet.io/gateway-resources"
	// AnnotationMITM names a kubernetes.io/tls Secret in the pod's namespace
	// holding the MITM CA (tls.crt, tls.key; proxyfleet mitm-ca init writes
	// them): the sidecar intercepts HTTPS with it, and the app containers get
	// the certificate only (never the key) and the variables that make common
	// clients trust it.
	AnnotationMITM = "proxyfleet.io/mitm"
	// AnnotationUpstreamCA names a ConfigMap in the pod's namespace holding
	// CA certificates (PEM) the sidecar trusts for sites' certificates
	// besides its image's roots, as NAME (key ca.crt) or NAME/KEY: a site
	// with a private CA (staging, an intranet) crawled under MITM or through
	// https:// absolute URIs, where the sidecar itself checks the site.
	// The sidecar's --upstream-ca-file; trust-manager's bundles are such
	// ConfigMaps.
	AnnotationUpstreamCA = "proxyfleet.io/upstream-ca"
)

// Names and paths the injected pod spec uses.
const (
	// SidecarName is the injected init container's name.
	SidecarName = "proxyfleet-gateway"
	// ProxyAddr is where the sidecar listens: loopback only, never an open proxy.
	ProxyAddr = "127.0.0.1:3128"
	// ProbePort serves the sidecar's /metrics, /healthz and /readyz on the
	// pod IP, where the kubelet's probes reach it (they cannot reach the
	// pod's loopback).
	ProbePort = 15090
	// StatusAddr serves the sidecar's status page on the pod's loopback,
	// which kubectl port-forward reaches and the pod network does not: the
	// page lists the fleet's members and cooldowns without authentication.
	StatusAddr = "127.0.0.1:15091"
	// TokenAudience is the audience of the projected token and of the lease
	// API's TokenReview.
	TokenAudience = "proxyfleet"
	// TokenVolume and TokenDir hold the projected token in the sidecar.
	TokenVolume = "proxyfleet-token"
	TokenDir    = "/var/run/secrets/proxyfleet.io/serviceaccount"
	// TokenPath is the token file the sidecar's --pool-sa-token-file reads.
	TokenPath = TokenDir + "/token"
	// MITMVolume (cert and key, sidecar only) and MITMCAVolume (cert only,
	// app containers) come from the AnnotationMITM Secret.
	MITMVolume   = "proxyfleet-mitm"
	MITMDir      = "/etc/proxyfleet/mitm"
	MITMCAVolume = "proxyfleet-mitm-ca"
	MITMCADir    = "/etc/proxyfleet/mitm-ca"
	// MITMCAFile is the CA certificate in the app containers.
	MITMCAFile = MITMCADir + "/ca.crt"
	// UpstreamCAVolume and UpstreamCADir hold the AnnotationUpstreamCA
	// ConfigMap's key in the sidecar, as UpstreamCAFile.
	UpstreamCAVolume = "proxyfleet-upstream-ca"
	UpstreamCADir    = "/etc/proxyfleet/upstream-ca"
	UpstreamCAFile   = UpstreamCADir + "/ca.crt"
	// MITMCommand is the sidecar's binary in a MITM pod. The sidecar
	// image's entrypoint is built without ClientHello mirroring (uTLS and
	// its HTTP/2 client: 4.3 MB of binary and every pod's memory), which a
	// pod without a MITM CA can never use; this one has it. The full image
	// links the path to its one binary.
	MITMCommand = "/proxyfleet-mitm"
	// sidecarUID is the sidecar's user: nobody in particular, not root.
	sidecarUID = 65532
)

// DefaultTokenExpirationSeconds is the projected token's lifetime; the
// kubelet refreshes it at 80%, and the sidecar re-reads the file.
const DefaultTokenExpirationSeconds = 3600

// Config is what the controller knows that pods do not say.
type Config struct {
	// Image is the sidecar's image (--gateway-image).
	Image string
	// PoolAPI is the lease API URL injected gateways lease from (--sidecar-lease-api).
	PoolAPI string
	// Resources are the sidecar's default resources; an annotation overrides them.
	Resources corev1.ResourceRequirements
	// ClusterDomain is the cluster's DNS domain (cluster.local), kept out of the proxy.
	ClusterDomain string
	// APIServerHosts are the API server's names or addresses, kept out of the proxy.
	APIServerHosts []string
	// ClusterNoProxy are more hosts, .domains, IPs and CIDRs every injected
	// pod reaches directly (--sidecar-no-proxy): the cluster's service and
	// pod CIDRs, which no API names. Without them a ClusterIP or a pod IP
	// (a short Service name resolves to one) goes to the sidecar, which
	// refuses private targets.
	ClusterNoProxy []string
	// ClusterTargets are the cluster's own pod and service ranges the
	// sidecars admit as targets although private (--cluster-target-cidrs,
	// passed on as the sidecar's flag of the same name). Names under the
	// cluster domain stay in NO_PROXY: a crawler reaches a site in the
	// cluster through its sidecar by the site's pod IP or ClusterIP.
	ClusterTargets []netip.Prefix
	// SkipNamespaces are never injected: the controller's own, whose pods
	// the webhook must not depend on.
	SkipNamespaces []string
	// TokenExpirationSeconds is the projected token's lifetime (default DefaultTokenExpirationSeconds).
	TokenExpirationSeconds int64
}

// Validate names the setting that is missing or wrong.
func (c Config) Validate() error {
	if c.Image == "" {
		return fmt.Errorf("sidecar injection: no gateway image (--gateway-image)")
	}
	if _, err := leaseapi.NewClient(c.PoolAPI, "", nil); err != nil {
		return fmt.Errorf("sidecar injection: --sidecar-lease-api: %w", err)
	}
	for _, h := range c.ClusterNoProxy {
		if err := checkNoProxyEntry(h); err != nil {
			return fmt.Errorf("sidecar injection: --sidecar-no-proxy: %w", err)
		}
	}
	if err := clustertargets.Check(c.ClusterTargets); err != nil {
		return fmt.Errorf("sidecar injection: --cluster-target-cidrs: %w", err)
	}
	if c.TokenExpirationSeconds != 0 && c.TokenExpirationSeconds < 600 {
		return fmt.Errorf("sidecar injection: token expiration %ds is below the API server's minimum of 600s", c.TokenExpirationSeconds)
	}
	return nil
}

// AnnotationError is a bad annotation value: the pod is rejected with it.
type AnnotationError struct {
	// Annotation is the key whose value is wrong.
	Annotation string
	// Err says what is wrong.
	Err error
}

// Error names the annotation.
func (e *AnnotationError) Error() string {
	return fmt.Sprintf("annotation %s: %v", e.Annotation, e.Err)
}

// Unwrap returns the cause.
func (e *AnnotationError) Unwrap() error { return e.Err }

// PortClashError is an app container declaring a port the sidecar listens
// on: the pod is rejected with it, as one of the two would fail to bind.
type PortClashError struct {
	// Container declares Port.
	Container string
	Port      int32
}

// Error says which container, which port, and what the sidecar uses it for.
func (e *PortClashError) Error() string {
	return fmt.Sprintf("container %s declares port %d, which the injected %s sidecar listens on (the proxy on %s, probes and metrics on %d, the status page on %s): one of them would fail to bind; move the app to another port",
		e.Container, e.Port, SidecarName, ProxyAddr, ProbePort, StatusAddr)
}

// sidecarPorts are the ports the sidecar binds in the pod's network.
func sidecarPorts() []int32 {
	out := []int32{ProbePort}
	for _, a := range []string{ProxyAddr, StatusAddr} {
		_, p, _ := net.SplitHostPort(a)
		port, _ := strconv.Atoi(p)
		out = append(out, int32(port))
	}
	return out
}

// checkPorts refuses a pod whose containers declare a sidecar port.
func checkPorts(pod *corev1.Pod) error {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, ct := range cs {
			for _, p := range ct.Ports {
				if slices.Contains(sidecarPorts(), p.ContainerPort) {
					return &PortClashError{Container: ct.Name, Port: p.ContainerPort}
				}
			}
		}
	}
	return nil
}

// Wanted reports whether pod asks for injection, given its namespace's
// labels: its own label decides when present, else the namespace's. It
// says why not, for the admission answer; refuse is set when the pod's own
// label asks for a sidecar it cannot have, so the pod is denied with why
// rather than started with direct egress (a namespace-wide opt-in skips
// such a pod quietly).
func (c Config) Wanted(pod *corev1.Pod, nsLabels map[string]string) (want bool, why string, refuse bool) {
	asked := pod.Labels[LabelInject] == "true"
	switch {
	case slices.Contains(c.SkipNamespaces, pod.Namespace):
		return false, "the controller's own namespace is never injected", false
	case pod.Spec.HostNetwork:
		return false, "hostNetwork pods share the node's loopback and network and cannot be injected: its gateway would listen on the node; remove the pod's " +
			LabelInject + " label, or run it without hostNetwork", asked
	case Injected(pod):
		return false, "already injected", false
	}
	if v, ok := pod.Labels[LabelInject]; ok {
		return v == "true", "pod label " + LabelInject + "=" + v, false
	}
	if nsLabels[LabelInject] == "true" {
		return true, "namespace label", false
	}
	return false, "not opted in", false
}

// Injected reports whether pod already has the sidecar.
func Injected(pod *corev1.Pod) bool {
	if pod.Annotations[AnnotationInjected] == "true" {
		return true
	}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, ct := range cs {
			if ct.Name == SidecarName {
				return true
			}
		}
	}
	return false
}

// settings are a pod's parsed annotations.
type settings struct {
	selector  string
	rotation  rotation.Mode
	noProxy   []string
	resources corev1.ResourceRequirements
	mitm      string
	// upstreamCA is the AnnotationUpstreamCA ConfigMap and its key.
	upstreamCA, upstreamCAKey string
}

// parseAnnotations reads the pod's annotations, naming the bad one.
func (c Config) parseAnnotations(a map[string]string) (settings, error) {
	s := settings{resources: *c.Resources.DeepCopy()}
	if v, ok := a[AnnotationSelector]; ok {
		sel, err := pool.ParseSelector(v)
		if err != nil {
			return s, &AnnotationError{AnnotationSelector, err}
		}
		keys := make([]string, 0, len(sel))
		for k := range sel {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			keys[i] = k + "=" + sel[k]
		}
		s.selector = strings.Join(keys, ",")
	}
	if v, ok := a[AnnotationRotation]; ok {
		m, err := rotation.ParseMode(v)
		if err != nil || strings.TrimSpace(v) == "" {
			return s, &AnnotationError{AnnotationRotation, fmt.Errorf("%q: want %s or %s", v, rotation.ModeSticky, rotation.ModeRequest)}
		}
		s.rotation = m
	}
	if v, ok := a[AnnotationNoProxy]; ok {
		for _, h := range strings.Split(v, ",") {
			h = strings.TrimSpace(h)
			if h == "" {
				continue
			}
			if err := checkNoProxyEntry(h); err != nil {
				return s, &AnnotationError{AnnotationNoProxy, err}
			}
			s.noProxy = append(s.noProxy, h)
		}
	}
	if v, ok := a[AnnotationGatewayResources]; ok {
		r, err := ParseResources(v, s.resources)
		if err != nil {
			return s, &AnnotationError{AnnotationGatewayResources, err}
		}
		s.resources = r
	}
	if v, ok := a[AnnotationMITM]; ok {
		if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
			return s, &AnnotationError{AnnotationMITM, fmt.Errorf("%q is not a Secret name: %s", v, strings.Join(errs, "; "))}
		}
		s.mitm = v
	}
	if v, ok := a[AnnotationUpstreamCA]; ok {
		name, key, err := parseConfigMapKey(v, "ca.crt")
		if err != nil {
			return s, &AnnotationError{AnnotationUpstreamCA, err}
		}
		s.upstreamCA, s.upstreamCAKey = name, key
	}
	return s, nil
}

// parseConfigMapKey reads NAME or NAME/KEY (key def without one): a
// ConfigMap name and one of its keys.
func parseConfigMapKey(v, def string) (name, key string, err error) {
	name, key, hasKey := strings.Cut(v, "/")
	if !hasKey {
		key = def
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", "", fmt.Errorf("%q: %q is not a ConfigMap name: %s; want NAME or NAME/KEY", v, name, strings.Join(errs, "; "))
	}
	if errs := validation.IsConfigMapKey(key); len(errs) > 0 {
		return "", "", fmt.Errorf("%q: %q is not a ConfigMap key: %s; want NAME or NAME/KEY", v, key, strings.Join(errs, "; "))
	}
	return name, key, nil
}

// checkNoProxyEntry accepts a host name, a .domain, an IP or a CIDR,
// optionally with a port: what Go, curl and Python read in NO_PROXY.
func checkNoProxyEntry(h string) error {
	if _, _, err := net.ParseCIDR(h); err == nil {
		return nil
	}
	host := h
	if hh, port, err := net.SplitHostPort(h); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return fmt.Errorf("%q: bad port", h)
		}
		host = hh
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	name := strings.TrimPrefix(strings.TrimPrefix(host, "*"), ".")
	if errs := validation.IsDNS1123Subdomain(strings.ToLower(name)); len(errs) > 0 {
		return fmt.Errorf("%q is not a host, .domain, IP or CIDR", h)
	}
	return nil
}

// ParseResources reads key=quantity pairs (requests.cpu, requests.memory,
// limits.cpu, limits.memory, comma-separated) over base, the defaults.
func ParseResources(s string, base corev1.ResourceRequirements) (corev1.ResourceRequirements, error) {
	out := *base.DeepCopy()
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return out, fmt.Errorf("%q is not key=quantity", pair)
		}
		kind, name, ok := strings.Cut(strings.TrimSpace(k), ".")
		if !ok || (name != "cpu" && name != "memory") || (kind != "requests" && kind != "limits") {
			return out, fmt.Errorf("%q: want requests.cpu, requests.memory, limits.cpu or limits.memory", k)
		}
		q, err := resource.ParseQuantity(strings.TrimSpace(v))
		if err != nil {
			return out, fmt.Errorf("%s=%q: %v", k, v, err)
		}
		if q.Sign() <= 0 {
			return out, fmt.Errorf("%s=%q: must be positive", k, v)
		}
		list := &out.Requests
		if kind == "limits" {
			list = &out.Limits
		}
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		(*list)[corev1.ResourceName(name)] = q
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := out.Requests[name]
		lim, hasLim := out.Limits[name]
		if hasReq && hasLim && req.Cmp(lim) > 0 {
			return out, fmt.Errorf("requests.%s %s is above limits.%s %s", name, req.String(), name, lim.String())
		}
	}
	return out, nil
}

// Mutate injects the sidecar into pod in place. It assumes Wanted said yes
// and returns an *AnnotationError for a bad annotation (pod untouched then).
func (c Config) Mutate(pod *corev1.Pod) error {
	s, err := c.parseAnnotations(pod.Annotations)
	if err != nil {
		return err
	}
	if err := checkPorts(pod); err != nil {
		return err
	}
	sidecar := c.sidecar(s)
	if pod.Spec.ServiceAccountName == "" {
		// What the ServiceAccount admission plugin sets anyway; the API
		// server refuses a token projection without it.
		pod.Spec.ServiceAccountName = "default"
	}
	pod.Spec.InitContainers = append([]corev1.Container{sidecar}, pod.Spec.InitContainers...)
	exp := c.TokenExpirationSeconds
	if exp == 0 {
		exp = DefaultTokenExpirationSeconds
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
		Name: TokenVolume,
		VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
				Audience: TokenAudience, ExpirationSeconds: ptr.To(exp), Path: "token",
			}}},
		}},
	})
	if s.upstreamCA != "" {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: UpstreamCAVolume, VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: s.upstreamCA},
				Items:                []corev1.KeyToPath{{Key: s.upstreamCAKey, Path: "ca.crt"}},
			},
		}})
	}
	env := c.proxyEnv(s)
	if s.mitm != "" {
		pod.Spec.Volumes = append(pod.Spec.Volumes,
			corev1.Volume{Name: MITMVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				// Secret files are root-owned; the sidecar runs as sidecarUID and
				// is the only container mounting this volume (key included).
				SecretName: s.mitm, DefaultMode: ptr.To[int32](0o444),
			}}},
			corev1.Volume{Name: MITMCAVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: s.mitm, Items: []corev1.KeyToPath{{Key: corev1.TLSCertKey, Path: "ca.crt"}},
			}}},
		)
		for _, name := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"} {
			env = append(env, corev1.EnvVar{Name: name, Value: MITMCAFile})
		}
	}
	for i := range pod.Spec.Containers {
		ct := &pod.Spec.Containers[i]
		ct.Env = mergeEnv(ct.Env, env)
		if s.mitm != "" {
			ct.VolumeMounts = append(ct.VolumeMounts, corev1.VolumeMount{Name: MITMCAVolume, MountPath: MITMCADir, ReadOnly: true})
		}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationInjected] = "true"
	return nil
}

// mergeEnv adds ours to a container's env. What the container sets itself
// wins, kept consistent across the upper- and lower-case forms (a container
// setting HTTPS_PROXY gets the same https_proxy, from the same Secret or
// ConfigMap key when it reads it from one: clients read one case or the
// other, and must not go two ways); NO_PROXY is the union, ours first, so
// cluster traffic stays direct whatever the pod adds (one read from a
// Secret or ConfigMap cannot be joined and is kept as the container's).
func mergeEnv(have, ours []corev1.EnvVar) []corev1.EnvVar {
	idx := map[string]int{}
	for i, e := range have {
		idx[e.Name] = i
	}
	own := func(name string) (corev1.EnvVar, bool) {
		for _, n := range []string{strings.ToUpper(name), strings.ToLower(name)} {
			if i, ok := idx[n]; ok {
				return have[i], true
			}
		}
		return corev1.EnvVar{}, false
	}
	for _, e := range ours {
		v := corev1.EnvVar{Name: e.Name, Value: e.Value}
		if mine, ok := own(e.Name); ok {
			switch {
			case mine.ValueFrom != nil:
				v.Value, v.ValueFrom = "", mine.ValueFrom.DeepCopy()
			case strings.EqualFold(e.Name, "NO_PROXY"):
				v.Value = unionList(e.Value, mine.Value)
			default:
				v.Value = mine.Value
			}
		}
		if i, ok := idx[e.Name]; ok {
			if have[i].ValueFrom == nil {
				have[i].Value = v.Value
			}
			continue
		}
		have = append(have, v)
		idx[e.Name] = len(have) - 1
	}
	return have
}

// unionList joins comma lists a then b without repeats.
func unionList(a, b string) string {
	var out []string
	for _, x := range strings.Split(a+","+b, ",") {
		if x = strings.TrimSpace(x); x != "" && !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return strings.Join(out, ",")
}

// NoProxy is the app containers' NO_PROXY: loopback, the cluster's service
// names, the API server, the cluster's own extras (ClusterNoProxy), then the
// pod's.
func (c Config) NoProxy(extra []string) string {
	list := []string{"localhost", "127.0.0.1", "::1", ".svc", "kubernetes.default"}
	if d := strings.Trim(c.ClusterDomain, "."); d != "" {
		list = append(list, "."+d)
	}
	for _, h := range slices.Concat(c.APIServerHosts, c.ClusterNoProxy, extra) {
		if !slices.Contains(list, h) {
			list = append(list, h)
		}
	}
	return strings.Join(list, ",")
}

// proxyEnv is what every app container gets: both cases, since curl reads
// only the lower-case http_proxy and some clients only the upper-case forms.
func (c Config) proxyEnv(s settings) []corev1.EnvVar {
	proxy := "http://" + ProxyAddr
	noProxy := c.NoProxy(s.noProxy)
	return []corev1.EnvVar{
		{Name: "HTTP_PROXY", Value: proxy},
		{Name: "HTTPS_PROXY", Value: proxy},
		{Name: "http_proxy", Value: proxy},
		{Name: "https_proxy", Value: proxy},
		{Name: "NO_PROXY", Value: noProxy},
		{Name: "no_proxy", Value: noProxy},
	}
}

// SidecarArgs are the sidecar's gateway arguments for settings s.
func (c Config) sidecarArgs(s settings) []string {
	args := []string{
		"gateway",
		"--listen=" + ProxyAddr,
		"--lease-api=" + c.PoolAPI,
		"--pool-sa-token-file=" + TokenPath,
		"--metrics-listen=:" + strconv.Itoa(ProbePort),
		"--status-listen=" + StatusAddr,
		"--log-format=json",
	}
	if s.selector != "" {
		args = append(args, "--pool-selector="+s.selector)
	}
	if s.rotation != "" {
		args = append(args, "--rotation="+string(s.rotation))
	}
	if s.mitm != "" {
		args = append(args, "--mitm-ca-cert="+MITMDir+"/"+corev1.TLSCertKey, "--mitm-ca-key="+MITMDir+"/"+corev1.TLSPrivateKeyKey)
	}
	if s.upstreamCA != "" {
		args = append(args, "--upstream-ca-file="+UpstreamCAFile)
	}
	if len(c.ClusterTargets) > 0 {
		cidrs := make([]string, len(c.ClusterTargets))
		for i, p := range c.ClusterTargets {
			cidrs[i] = p.String()
		}
		args = append(args, "--cluster-target-cidrs="+strings.Join(cidrs, ","))
	}
	return args
}

// runtimeEnv sizes the sidecar's Go runtime to its resources, since the
// runtime otherwise sizes itself to the node:
//
//   - Without a CPU limit Go runs as many processors (Ps) as the node has
//     cores: on a 64-core node an idle sidecar then holds about 2 MiB more
//     (20.6-20.9 MiB against 18.6 MiB with two, measured with GOMAXPROCS=64;
//     the sidecar's goal is 20 MiB), and every P adds scheduler wake-ups to
//     each request. So GOMAXPROCS is the CPU request rounded up, at least 2
//     (so that the collector's background work never takes the only
//     processor a request needs). With a CPU limit Go follows the limit by
//     itself, and nothing is set.
//   - A memory limit becomes GOMEMLIMIT at 90 % of it: the collector works
//     harder as the heap nears the limit instead of the kubelet killing the
//     container; the rest is for what the Go runtime does not count (the
//     binary's own pages).
func runtimeEnv(res corev1.ResourceRequirements) []corev1.EnvVar {
	var env []corev1.EnvVar
	if _, limited := res.Limits[corev1.ResourceCPU]; !limited {
		procs := int64(2)
		if req, ok := res.Requests[corev1.ResourceCPU]; ok {
			procs = max(procs, (req.MilliValue()+999)/1000)
		}
		env = append(env, corev1.EnvVar{Name: "GOMAXPROCS", Value: strconv.FormatInt(procs, 10)})
	}
	if lim, ok := res.Limits[corev1.ResourceMemory]; ok && lim.Value() > 0 {
		env = append(env, corev1.EnvVar{Name: "GOMEMLIMIT", Value: strconv.FormatInt(lim.Value()/10*9, 10)})
	}
	return env
}

// sidecar is the native sidecar: an init container that keeps running
// (restartPolicy Always), started and ready before the app containers.
func (c Config) sidecar(s settings) corev1.Container {
	probe := func(period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/readyz", Port: intstr.FromInt32(ProbePort),
			}},
			PeriodSeconds: period, FailureThreshold: failures, TimeoutSeconds: 2,
		}
	}
	mounts := []corev1.VolumeMount{{Name: TokenVolume, MountPath: TokenDir, ReadOnly: true}}
	if s.mitm != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: MITMVolume, MountPath: MITMDir, ReadOnly: true})
	}
	if s.upstreamCA != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: UpstreamCAVolume, MountPath: UpstreamCADir, ReadOnly: true})
	}
	var command []string
	if s.mitm != "" {
		command = []string{MITMCommand}
	}
	return corev1.Container{
		Name:           SidecarName,
		Image:          c.Image,
		Command:        command,
		Args:           c.sidecarArgs(s),
		RestartPolicy:  ptr.To(corev1.ContainerRestartPolicyAlways),
		Ports:          []corev1.ContainerPort{{Name: "pf-metrics", ContainerPort: ProbePort, Protocol: corev1.ProtocolTCP}},
		Resources:      s.resources,
		Env:            runtimeEnv(s.resources),
		StartupProbe:   probe(1, 120),
		ReadinessProbe: probe(5, 3),
		VolumeMounts:   mounts,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To[int64](sidecarUID),
			RunAsGroup:               ptr.To[int64](sidecarUID),
			ReadOnlyRootFilesystem:   ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}
