// Package kubernetes is the provider that runs each upstream proxy as a Squid
// Pod in the controller's own cluster. It needs no cloud account, which makes
// it the provider for local development, CI and clusters whose node IPs are
// the egress addresses wanted. Pods share their node's egress IP, so distinct
// egress addresses per proxy remain the VM providers' job.
//
// It owns its block of the providers config file (config.go: Type,
// ReadConfig), which the binary's composition root wires to the type name.
// It imports the providers contract and providers/squidconf, never another
// provider, the controller or cmd.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/clustertargets"
	"github.com/proxyfleet/proxyfleet/providers"
)

// DefaultImage is the Squid image Pods run unless configured otherwise:
// Canonical's ubuntu/squid, Squid 6.6 on Ubuntu 24.04 LTS. The tag pins the
// Squid version and the Ubuntu release; Canonical rebuilds it for security
// fixes. Pin a digest through the config's image field for byte-identical
// Pods. Any image works that has /usr/sbin/squid and the Debian "proxy" user
// (uid 13).
const DefaultImage = "ubuntu/squid:6.6-24.04_beta"

// listPageSize bounds one List response; ListByTag follows continue tokens.
const listPageSize = 500

// Constructor returns the registry constructor for type kubernetes, whose
// Squids admit clusterTargets (Config.ClusterTargets; checked by the
// caller with clustertargets.Parse) as destinations. c should
// talk to the API server directly (client.New), not through the manager's
// cache: a cached client would start a cluster-wide Pod informer, needing
// watch RBAC and memory for every Pod, and could answer Get from a stale view.
func Constructor(c client.Client, clusterTargets []netip.Prefix) providers.Constructor {
	return func(e providers.Entry) (providers.Provider, error) {
		cfg, err := ReadConfig(e)
		if err != nil {
			return nil, err
		}
		cfg.ClusterTargets = clusterTargets
		return New(c, cfg)
	}
}

// Provider runs Squid Pods. It is safe for concurrent use; it keeps no state
// beyond its configuration.
type Provider struct {
	client client.Client
	cfg    Config
	// pageSize bounds one List response in ListByTag.
	pageSize int64
}

var (
	_ providers.Provider = (*Provider)(nil)
	_ providers.Checker  = (*Provider)(nil)
)

// New returns a provider creating Pods in cfg.Namespace through c.
func New(c client.Client, cfg Config) (*Provider, error) {
	if c == nil {
		return nil, errors.New("kubernetes provider: a client is required")
	}
	if msgs := validation.IsDNS1123Label(cfg.Namespace); len(msgs) > 0 {
		return nil, fmt.Errorf("kubernetes provider: namespace %q: %s", cfg.Namespace, strings.Join(msgs, "; "))
	}
	if err := clustertargets.Check(cfg.ClusterTargets); err != nil {
		return nil, fmt.Errorf("kubernetes provider: cluster targets: %w", err)
	}
	if cfg.Image == "" {
		cfg.Image = DefaultImage
	}
	return &Provider{client: c, cfg: cfg, pageSize: listPageSize}, nil
}

// Create creates the Squid Pod for req. An existing managed Pod of the same
// name and owner is returned as success; one that is still terminating is
// ErrTransient (the replacement must wait for it); one owned by another UID
// or not managed by proxyfleet is ErrPermanent, never adopted.
// req.CloudInit is ignored: the Pod's configuration is the generated squid.conf.
// The Pod is the only thing it makes, in one call, so a failed Create has
// made nothing to undo, except when the answer was lost after the API
// server stored the Pod: the retried Create adopts it, and deleting the
// Proxy deletes it by the name ProviderIDFor derives.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (providers.Instance, error) {
	pod, err := buildPod(p.cfg, req)
	if err != nil {
		return providers.Instance{}, err
	}
	err = p.client.Create(ctx, pod)
	if err == nil {
		return instanceOf(pod), nil
	}
	if !apierrors.IsAlreadyExists(err) {
		if apierrors.IsNotFound(err) {
			// The namespace is missing. It may be created later (a chart
			// installing in parallel), so retry instead of latching Failed.
			return providers.Instance{}, fmt.Errorf("%w: creating pod %s/%s: namespace %s does not exist: %w",
				providers.ErrTransient, pod.Namespace, pod.Name, pod.Namespace, err)
		}
		return providers.Instance{}, classify("creating pod "+pod.Namespace+"/"+pod.Name, err)
	}
	var existing corev1.Pod
	if err := p.client.Get(ctx, client.ObjectKeyFromObject(pod), &existing); err != nil {
		if apierrors.IsNotFound(err) {
			return providers.Instance{}, fmt.Errorf("%w: pod %s/%s vanished right after colliding with it; retrying", providers.ErrTransient, pod.Namespace, pod.Name)
		}
		return providers.Instance{}, classify("reading existing pod "+pod.Namespace+"/"+pod.Name, err)
	}
	switch {
	case !managed(&existing):
		return providers.Instance{}, fmt.Errorf("%w: pod %s/%s exists and is not managed by proxyfleet; refusing to adopt it",
			providers.ErrPermanent, existing.Namespace, existing.Name)
	case existing.Labels[LabelOwnerUID] != req.OwnerUID:
		return providers.Instance{}, fmt.Errorf("%w: pod %s/%s belongs to proxy UID %q, not %q",
			providers.ErrPermanent, existing.Namespace, existing.Name, existing.Labels[LabelOwnerUID], req.OwnerUID)
	case existing.DeletionTimestamp != nil:
		return providers.Instance{}, fmt.Errorf("%w: pod %s/%s is still terminating", providers.ErrTransient, existing.Namespace, existing.Name)
	}
	return instanceOf(&existing), nil
}

// ProviderIDFor is the providerID Create(req) would return: the Pod of
// req.Name in the configured namespace.
func (p *Provider) ProviderIDFor(req providers.CreateRequest) (string, error) {
	if msgs := validation.IsDNS1123Subdomain(req.Name); len(msgs) > 0 {
		return "", fmt.Errorf("%w: instance name %q: %s", providers.ErrPermanent, req.Name, strings.Join(msgs, "; "))
	}
	return formatProviderID(p.cfg.Namespace, req.Name), nil
}

// Get observes the Pod providerID names. A missing Pod, or one not managed by
// proxyfleet, is ErrNotFound.
func (p *Provider) Get(ctx context.Context, providerID string) (providers.Instance, error) {
	key, err := parseProviderID(providerID)
	if err != nil {
		return providers.Instance{}, err
	}
	var pod corev1.Pod
	if err := p.client.Get(ctx, key, &pod); err != nil {
		return providers.Instance{}, classify("getting pod "+key.String(), err)
	}
	if !managed(&pod) {
		return providers.Instance{}, fmt.Errorf("%w: pod %s is not managed by proxyfleet", providers.ErrNotFound, key)
	}
	return instanceOf(&pod), nil
}

// Delete deletes the Pod providerID names. A missing Pod, one already
// terminating, or one not managed by proxyfleet (never touched) is success.
// The delete carries the observed Pod's UID as a precondition, so a Pod
// recreated under the same name in between is never deleted by mistake.
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	key, err := parseProviderID(providerID)
	if err != nil {
		return err
	}
	var pod corev1.Pod
	if err := p.client.Get(ctx, key, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return classify("getting pod "+key.String(), err)
	}
	if !managed(&pod) || pod.DeletionTimestamp != nil {
		return nil
	}
	err = p.client.Delete(ctx, &pod, client.Preconditions{UID: ptr.To(pod.UID)})
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	return classify("deleting pod "+key.String(), err)
}

// ListByTag lists every proxyfleet Pod in every namespace (not only this
// entry's): the GC must see instances left behind by an entry whose namespace
// changed. It fails as a whole when any page fails.
func (p *Provider) ListByTag(ctx context.Context) ([]providers.Instance, error) {
	var out []providers.Instance
	opts := []client.ListOption{client.MatchingLabels{LabelManagedBy: ManagedBy}, client.Limit(p.pageSize)}
	cont := ""
	for {
		var pods corev1.PodList
		if err := p.client.List(ctx, &pods, append(opts, client.Continue(cont))...); err != nil {
			return nil, classify("listing managed pods", err)
		}
		for i := range pods.Items {
			inst := instanceOf(&pods.Items[i])
			inst.Parts = []string{providers.PartPod}
			out = append(out, inst)
		}
		cont = pods.Continue
		if cont == "" {
			return out, nil
		}
	}
}

// Check lists at most one managed Pod cluster-wide — the verb and scope
// ListByTag and the GC rely on — and reports one target, "apiserver".
func (p *Provider) Check(ctx context.Context) []providers.TargetStatus {
	var pods corev1.PodList
	err := p.client.List(ctx, &pods, client.MatchingLabels{LabelManagedBy: ManagedBy}, client.Limit(1))
	st := providers.TargetStatus{Target: "apiserver", Details: map[string]string{"namespace": p.cfg.Namespace, "image": p.cfg.Image}}
	switch {
	case err == nil:
		st.Ready, st.Reason, st.Message = true, "OK", "listing managed pods cluster-wide works"
	case apierrors.IsForbidden(err):
		st.Reason, st.Message = "Forbidden", "the controller may not list pods cluster-wide: "+err.Error()
	case apierrors.IsUnauthorized(err):
		st.Reason, st.Message = "Unauthorized", err.Error()
	case errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err):
		st.Reason, st.Message = "Timeout", err.Error()
	default:
		st.Reason, st.Message = "Unreachable", err.Error()
	}
	return []providers.TargetStatus{st}
}

// providerIDPrefix starts every providerID of this provider.
const providerIDPrefix = "kubernetes://"

// formatProviderID returns "kubernetes://<namespace>/<name>".
func formatProviderID(namespace, name string) string {
	return providerIDPrefix + namespace + "/" + name
}

// parseProviderID parses "kubernetes://<namespace>/<name>" strictly: exactly
// two segments, a DNS-1123 label namespace and a DNS-1123 subdomain name.
// Anything else is ErrPermanent, since retrying cannot make it parse.
func parseProviderID(id string) (types.NamespacedName, error) {
	rest, ok := strings.CutPrefix(id, providerIDPrefix)
	ns, name, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || strings.Contains(name, "/") ||
		len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return types.NamespacedName{}, fmt.Errorf("%w: invalid providerID %q: want kubernetes://<namespace>/<name>", providers.ErrPermanent, id)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// classify wraps an API error with its taxonomy class.
//
//   - NotFound → ErrNotFound.
//   - Forbidden → ErrPermanent: RBAC denial, admission policy and a
//     terminating namespace all arrive as 403, and retrying a request the API
//     server may never allow only hammers it. Two 403s are told apart by the
//     message the ResourceQuota admission plugin writes: "exceeded quota"
//     → ErrQuotaExceeded (the reconciler waits and retries, since freed quota
//     heals it), and "status unknown for quota" (the quota controller has not
//     counted usage yet) → ErrTransient.
//   - Invalid, BadRequest, MethodNotSupported, NotAcceptable,
//     UnsupportedMediaType, RequestEntityTooLarge → ErrPermanent.
//   - Unauthorized → ErrTransient: a rotated service-account token is re-read
//     by client-go, so 401 is usually momentary.
//   - Conflict, AlreadyExists, Timeout, ServerTimeout, TooManyRequests,
//     InternalError, ServiceUnavailable, any other 5xx, network and context
//     errors → ErrTransient.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var class error
	switch {
	case apierrors.IsNotFound(err):
		class = providers.ErrNotFound
	case apierrors.IsForbidden(err):
		msg := err.Error()
		switch {
		case strings.Contains(msg, "exceeded quota"):
			class = providers.ErrQuotaExceeded
		case strings.Contains(msg, "status unknown for quota"):
			class = providers.ErrTransient
		default:
			class = providers.ErrPermanent
		}
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsMethodNotSupported(err),
		apierrors.IsNotAcceptable(err), apierrors.IsUnsupportedMediaType(err), apierrors.IsRequestEntityTooLargeError(err):
		class = providers.ErrPermanent
	default:
		class = providers.ErrTransient
	}
	return fmt.Errorf("%w: %s: %w", class, op, err)
}
