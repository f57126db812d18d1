// Package providers is the contract between the Proxy reconciler and the
// backends that run upstream proxies (Squid pods, cloud VMs, KVM guests): the
// Provider interface, the optional Checker, the error taxonomy every backend
// maps its failures onto, deterministic instance names, the providers config
// file's shape (each entry's name, type and raw block; each type's package
// reads its own block), a registry that builds providers from it, and the
// metrics and tracing decorators.
//
// It must not import its sub-packages or know any type's settings: the
// binary's composition root (cmd/proxyfleet) maps each type name to its
// Decoder and Constructor. It imports nothing of the controller or gateway.
//
// The reconciler never watches backend resources: it observes instances only by
// polling Get, so every backend — including ones without any watch API —
// behaves the same. docs/providers.md states the rules per method.
package providers

import (
	"context"
	"time"
)

// Provider creates, observes and deletes the instances behind Managed Proxies.
// Implementations MUST be safe for concurrent use: the reconciler runs several
// workers, the orphan GC and the health monitor call the same value.
type Provider interface {
	// Create starts the instance named req.Name. It MUST be idempotent by name:
	// when an instance of that name already exists and belongs to req.OwnerUID,
	// Create returns it with a nil error instead of failing (a retried Create
	// after a crash or timeout is normal), and it reuses or removes whatever
	// else an earlier, cut-off attempt left under that name. It returns as
	// soon as the backend has accepted the request; readiness is discovered
	// by polling Get. It either finishes or undoes what it made before it
	// returns an error: the reconciler records nothing of a failed Create.
	Create(ctx context.Context, req CreateRequest) (Instance, error)
	// Get observes the instance. It returns an error wrapping ErrNotFound when
	// the instance is gone, which the reconciler answers by creating it again.
	Get(ctx context.Context, providerID string) (Instance, error)
	// Delete starts deleting the instance and returns; callers poll Get until it
	// reports ErrNotFound. It MUST tolerate an instance that is already gone or
	// already being deleted (nil error), because deletion is retried.
	Delete(ctx context.Context, providerID string) error
	// ListByTag lists every instance this provider manages, wherever it runs,
	// with OwnerUID and CreatedAt filled in, so the orphan GC can delete the
	// ones whose Proxy no longer exists. It MUST fail as a whole rather than
	// return a partial list that hides instances it could not see.
	ListByTag(ctx context.Context) ([]Instance, error)
}

// IDDeriver is implemented by providers that can tell, without a backend
// call, which providerID Create would give the instance of a request. The
// reconciler uses it to delete what a Create may have left when its Proxy
// never recorded a providerID (the process died after the backend accepted
// the request, or its answer was lost), instead of releasing the Proxy and
// leaving the rest to the orphan GC's grace period.
type IDDeriver interface {
	// ProviderIDFor returns the providerID Create(req) would return. It
	// reads only req.Name and req.Placement and makes no call. An error
	// wrapping ErrPermanent means no Create of req can have made anything
	// (a placement that names no configured zone or host).
	ProviderIDFor(req CreateRequest) (string, error)
}

// ProviderIDFor asks p, or the provider a decorator wraps, for the
// providerID Create(req) would return; ok is false when no layer is an
// IDDeriver.
func ProviderIDFor(p Provider, req CreateRequest) (id string, ok bool, err error) {
	for p != nil {
		if d, isDeriver := p.(IDDeriver); isDeriver {
			id, err = d.ProviderIDFor(req)
			return id, true, err
		}
		u, isWrapper := p.(Unwrapper)
		if !isWrapper {
			return "", false, nil
		}
		p = u.Unwrap()
	}
	return "", false, nil
}

// Checker is implemented by providers that can tell whether their backend is
// reachable right now, without waiting for a Proxy to fail.
type Checker interface {
	// Check returns one verdict per target (an API server, a project, a host).
	// It never fails as a whole: an unreachable target is a TargetStatus with
	// Ready false. It honours ctx's deadline.
	Check(ctx context.Context) []TargetStatus
}

// TargetStatus is the verdict of one Check on one target.
type TargetStatus struct {
	// Target names what was checked, stable across checks ("apiserver", a host name).
	Target string
	// Ready is true when the provider could use the target right now.
	Ready bool
	// Reason is a CamelCase machine-readable cause ("OK", "Forbidden", "Unreachable").
	Reason string
	// Message is for humans; it never carries a secret.
	Message string
	// Details are optional facts about the target (versions, capacity).
	Details map[string]string
}

// Placement says where and on what an instance runs. Every field is optional
// unless a provider documents otherwise; each provider documents its meaning.
// The json tags are the keys of a provider block's defaults in the config file.
type Placement struct {
	// Zone is a cloud zone, a KVM host, or a Kubernetes topology zone.
	Zone string `json:"zone,omitempty"`
	// MachineType is a VM shape or a node instance type.
	MachineType string `json:"machineType,omitempty"`
	// Image is a VM image or, for the kubernetes provider, a container image.
	Image string `json:"image,omitempty"`
}

// CreateRequest is everything a provider needs to start one instance. It
// carries plain fields so providers do not depend on the Kubernetes API types;
// the reconciler maps a Proxy onto it.
type CreateRequest struct {
	// Name is the instance name, NameFromUID(OwnerUID): deterministic, so a
	// retried Create finds the instance a previous attempt started.
	Name string
	// OwnerUID is the owning Proxy's UID; every instance carries it so the
	// orphan GC can prove ownership.
	OwnerUID string
	// Installation is the ID of the controller installation (cluster) that
	// creates the instance; every instance carries it so the orphan GC of
	// another installation sharing the backend (a cloud project, a
	// hypervisor) never takes it for an orphan of its own.
	Installation string
	// OwnerName and OwnerNamespace name the owning Proxy, for humans reading
	// the backend (labels, descriptions).
	OwnerName      string
	OwnerNamespace string
	// Port is where the proxy listens on the instance (1-65535).
	Port int
	// Placement is the Proxy's spec.placement.
	Placement Placement
	// CloudInit is the resolved user-data for VM backends; nil when none.
	CloudInit []byte
	// Labels are extra labels applied where the backend supports them. Keys a
	// provider reserves for itself (ownership, managed-by) win over these.
	Labels map[string]string
	// ProxyAuth is the basic-auth login the instance's proxy must demand
	// when the provider boots its own bootstrap (CloudInit empty). The
	// reconciler sets it only for providers implementing AuthBootstrapper;
	// it is nil otherwise.
	ProxyAuth *BasicAuth
}

// BasicAuth is a user name and password an upstream proxy demands. Its
// String and GoString never print the password, so a request logged by
// mistake does not leak it.
type BasicAuth struct {
	Username string
	Password string
}

// String returns the user name with the password masked.
func (b BasicAuth) String() string { return b.Username + ":xxxxx" }

// GoString is String, for %#v.
func (b BasicAuth) GoString() string { return "BasicAuth{" + b.String() + "}" }

// AuthBootstrapper is implemented by providers whose own bootstrap (the one
// used when CreateRequest.CloudInit is empty) runs a proxy reachable from
// outside the cluster, such as a VM with a public address. For them the
// reconciler generates per-Proxy credentials, keeps them in a Secret, passes
// them as CreateRequest.ProxyAuth and probes and hands out the proxy with
// them: such a proxy must never be open.
type AuthBootstrapper interface {
	// BootstrapRequiresAuth reports whether the bootstrap needs ProxyAuth.
	BootstrapRequiresAuth() bool
}

// RequiresProxyAuth reports whether p, or the provider a decorator wraps,
// is an AuthBootstrapper that needs credentials.
func RequiresProxyAuth(p Provider) bool {
	for p != nil {
		if a, ok := p.(AuthBootstrapper); ok {
			return a.BootstrapRequiresAuth()
		}
		u, ok := p.(Unwrapper)
		if !ok {
			return false
		}
		p = u.Unwrap()
	}
	return false
}

// State is an instance's lifecycle state as the reconciler acts on it.
type State string

const (
	// StateProvisioning: accepted but not yet usable (booting, no IP yet, or
	// the backend cannot tell right now). The reconciler polls again.
	StateProvisioning State = "Provisioning"
	// StateRunning: up with an IP clients can reach on the proxy port.
	StateRunning State = "Running"
	// StateStopped: exists but is not running and will not by itself. The
	// reconciler deletes and recreates it (cattle).
	StateStopped State = "Stopped"
	// StateTerminated: finished or being deleted. The reconciler deletes it
	// (a no-op when already deleting) and polls until it is gone.
	StateTerminated State = "Terminated"
)

// Instance is one backend instance as a provider observed it.
type Instance struct {
	// ProviderID identifies the instance for Get and Delete; the reconciler
	// stores it in status.providerID. Its format is provider-specific.
	ProviderID string
	// Name is the instance name (CreateRequest.Name).
	Name string
	// State is the lifecycle state.
	State State
	// IP is the address clients and probes use; empty until one is known.
	IP string
	// OwnerUID is the UID the instance is tagged with; empty when untagged,
	// which the GC reads as "never delete".
	OwnerUID string
	// Installation is the installation ID the instance is tagged with
	// (CreateRequest.Installation); the GC deletes only its own
	// installation's instances, so empty (one made before installations
	// were tagged) is never deleted either.
	Installation string
	// CreatedAt is when the backend created the instance; the GC leaves young
	// instances alone because their Proxy may not have recorded them yet.
	CreatedAt time.Time
	// Parts names the kinds of backend object ListByTag found for the
	// instance (kvm: PartDomain, PartOverlay, PartSeed, PartMark; gcp:
	// PartVM; kubernetes: PartPod), so the orphan GC counts what it removes
	// per kind. An instance half made by a cut-off Create may lack its main
	// part (volumes without a domain). Create and Get leave it empty.
	Parts []string
}

// Part kinds of Instance.Parts, the orphan GC's metric label.
const (
	PartPod     = "pod"
	PartVM      = "vm"
	PartDomain  = "domain"
	PartOverlay = "overlay"
	PartSeed    = "seed"
	PartMark    = "mark"
)
