// Package gcp is the provider that runs each upstream proxy as a Compute
// Engine VM: one VM per Proxy, so every Proxy has an egress address of its
// own, which is what the fleet exists for.
//
// It makes exactly four API calls — instances Insert, Get, Delete and
// AggregatedList — and never waits on an Operation: Create returns once the
// API accepted the insert, and the reconciler finds readiness by polling Get,
// as it does for every provider. A VM booted with the provider's own
// cloud-init runs a Squid that demands the per-Proxy credentials the
// controller generated, so a VM on a public address is never an open proxy.
//
// It owns its block of the providers config file (config.go: Type,
// ReadConfig; the block is Config itself), which the binary's composition
// root wires to the type name. It imports the providers contract and
// providers/bootstrap, never another provider, the controller or cmd.
package gcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/providers"
)

// Labels on every VM this provider creates. Compute Engine label keys allow
// neither "/" nor ".", so these are the GCP spellings of the labels the
// kubernetes provider puts on Pods.
const (
	// LabelManagedBy with value ManagedBy marks a VM as proxyfleet's;
	// ListByTag filters on it and Get treats VMs without it as absent.
	LabelManagedBy = "managed-by"
	// ManagedBy is LabelManagedBy's value.
	ManagedBy = "proxyfleet"
	// LabelOwnerUID carries the owning Proxy's UID: the orphan GC's proof of
	// ownership, and how Create tells its own earlier attempt from a stranger.
	LabelOwnerUID = "proxyfleet-uid"
	// LabelOwnerName carries the owning Proxy's name when it is a valid label value.
	LabelOwnerName = "proxyfleet-name"
	// LabelInstallation carries the creating controller's installation ID
	// (providers.CreateRequest.Installation): the orphan GC deletes only its
	// own installation's VMs, so two clusters may share a project.
	LabelInstallation = "proxyfleet-installation"
)

// userDataKey is the metadata key cloud-init reads on Compute Engine.
const userDataKey = "user-data"

// Constructor returns the registry constructor for type gcp. ctx bounds the
// clients' lifetime; it is the controller's root context.
func Constructor(ctx context.Context) providers.Constructor {
	return func(e providers.Entry) (providers.Provider, error) {
		cfg, err := ReadConfig(e)
		if err != nil {
			return nil, err
		}
		c, err := compute.NewInstancesRESTClient(ctx, cfg.clientOptions()...)
		if err != nil {
			// No credentials found is the usual cause; the message names
			// where they were looked for, never their content.
			return nil, fmt.Errorf("gcp compute client: %w", err)
		}
		return New(c, cfg)
	}
}

// Provider runs Squid VMs in one project. It is safe for concurrent use; it
// keeps no state beyond its configuration and client.
type Provider struct {
	client *compute.InstancesClient
	cfg    Config
	// noRetry makes every call a single attempt: the reconciler already
	// retries with backoff, and a call blocked in the SDK's own retry loop
	// would hold a reconcile worker for up to ten minutes.
	noRetry gax.CallOption
}

var (
	_ providers.Provider         = (*Provider)(nil)
	_ providers.Checker          = (*Provider)(nil)
	_ providers.AuthBootstrapper = (*Provider)(nil)
)

// New returns a provider creating VMs in cfg.Project through c.
func New(c *compute.InstancesClient, cfg Config) (*Provider, error) {
	if c == nil {
		return nil, errors.New("gcp provider: a compute client is required")
	}
	if cfg.Project == "" {
		return nil, errors.New("gcp provider: project is required")
	}
	if cfg.AddressType == "" {
		cfg.AddressType = AddressExternal
	}
	if cfg.AddressType != AddressExternal && cfg.AddressType != AddressInternal {
		return nil, fmt.Errorf("gcp provider: addressType %q is not external or internal", cfg.AddressType)
	}
	return &Provider{client: c, cfg: cfg, noRetry: gax.WithRetry(func() gax.Retryer { return nil })}, nil
}

// BootstrapRequiresAuth is true: the VM's Squid is reachable from outside the
// cluster, so the bootstrap always demands per-Proxy credentials.
func (p *Provider) BootstrapRequiresAuth() bool { return true }

// Create inserts the VM for req and returns without waiting for the
// operation. An insert answered 409 alreadyExists is an earlier attempt of
// this very Create (names derive from the Proxy UID): the VM is read back and
// returned when it carries req.OwnerUID, and refused as ErrPermanent when it
// belongs to someone else. An insert whose operation comes back already
// ended in error (a stockout, a quota, an image that does not exist) is
// undone before the error is returned: whatever the failed insert left
// under the name is deleted, so a failed Create leaves no VM. A failure the
// operation reports later is seen by Get (the VM is missing or stopped) and
// answered by the reconciler as any lost instance.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (providers.Instance, error) {
	ins, zone, err := buildInstance(p.cfg, req)
	if err != nil {
		return providers.Instance{}, err
	}
	op, err := p.client.Insert(ctx, &computepb.InsertInstanceRequest{
		Project: p.cfg.Project, Zone: zone, InstanceResource: ins,
	}, p.noRetry)
	id := formatProviderID(zone, req.Name)
	if err == nil {
		if opErr := operationError(op.Proto()); opErr != nil {
			return providers.Instance{}, p.undo(ctx, id, classify("inserting instance "+id, opErr))
		}
		return providers.Instance{ProviderID: id, Name: req.Name, State: providers.StateProvisioning, OwnerUID: req.OwnerUID, Installation: req.Installation}, nil
	}
	if !isAlreadyExists(err) {
		return providers.Instance{}, classify("inserting instance "+id, err)
	}
	existing, err := p.client.Get(ctx, &computepb.GetInstanceRequest{Project: p.cfg.Project, Zone: zone, Instance: req.Name}, p.noRetry)
	if err != nil {
		if c := classify("", err); errors.Is(c, providers.ErrNotFound) {
			return providers.Instance{}, fmt.Errorf("%w: instance %s vanished right after colliding with it; retrying", providers.ErrTransient, id)
		}
		return providers.Instance{}, classify("reading existing instance "+id, err)
	}
	labels := existing.GetLabels()
	switch {
	case labels[LabelManagedBy] != ManagedBy:
		return providers.Instance{}, fmt.Errorf("%w: instance %s exists and is not managed by proxyfleet; refusing to adopt it", providers.ErrPermanent, id)
	case labels[LabelOwnerUID] != req.OwnerUID:
		return providers.Instance{}, fmt.Errorf("%w: instance %s belongs to proxy UID %q, not %q", providers.ErrPermanent, id, labels[LabelOwnerUID], req.OwnerUID)
	}
	return p.instanceOf(existing, zone), nil
}

// undo deletes what a failed insert may have left under id and returns
// cause, with the delete's own failure added to the message when there is
// one (cause's class stays the verdict; deleting the Proxy or the orphan
// GC finishes it). It runs on a context of its own so a Create its caller
// gave up on still cleans up.
func (p *Provider) undo(ctx context.Context, id string, cause error) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoBudget)
	defer cancel()
	if err := p.Delete(uctx, id); err != nil {
		return fmt.Errorf("%w (deleting what the failed insert left failed too: %v)", cause, err)
	}
	return cause
}

// undoBudget bounds the delete a failed Create makes behind itself.
const undoBudget = 30 * time.Second

// operationError is the error an operation ended in, as the googleapi
// error classify reads (the operation's HTTP status and its error codes as
// reasons), or nil while it runs or when it succeeded.
func operationError(op *computepb.Operation) error {
	if op.GetStatus() != computepb.Operation_DONE || op.GetError() == nil || len(op.GetError().GetErrors()) == 0 {
		return nil
	}
	ge := &googleapi.Error{Code: int(op.GetHttpErrorStatusCode())}
	var msgs []string
	for _, e := range op.GetError().GetErrors() {
		ge.Errors = append(ge.Errors, googleapi.ErrorItem{Reason: e.GetCode(), Message: e.GetMessage()})
		msgs = append(msgs, e.GetCode()+": "+e.GetMessage())
	}
	ge.Message = "the insert operation ended in error: " + strings.Join(msgs, "; ")
	return ge
}

// ProviderIDFor is the providerID Create(req) would return: the zone its
// placement resolves to and the name.
func (p *Provider) ProviderIDFor(req providers.CreateRequest) (string, error) {
	zone := firstNonEmpty(req.Placement.Zone, p.cfg.Defaults.Zone)
	if !zonePattern.MatchString(zone) || !namePattern.MatchString(req.Name) {
		return "", fmt.Errorf("%w: zone %q and instance name %q name no instance", providers.ErrPermanent, zone, req.Name)
	}
	return formatProviderID(zone, req.Name), nil
}

// Get observes the VM providerID names. A missing VM, or one not managed by
// proxyfleet, is ErrNotFound.
func (p *Provider) Get(ctx context.Context, providerID string) (providers.Instance, error) {
	zone, name, err := parseProviderID(providerID)
	if err != nil {
		return providers.Instance{}, err
	}
	ins, err := p.client.Get(ctx, &computepb.GetInstanceRequest{Project: p.cfg.Project, Zone: zone, Instance: name}, p.noRetry)
	if err != nil {
		return providers.Instance{}, classify("getting instance "+providerID, err)
	}
	if ins.GetLabels()[LabelManagedBy] != ManagedBy {
		return providers.Instance{}, fmt.Errorf("%w: instance %s is not managed by proxyfleet", providers.ErrNotFound, providerID)
	}
	return p.instanceOf(ins, zone), nil
}

// Delete starts deleting the VM and returns without waiting. 404 is success:
// the VM is already gone (deletion is retried, and GC may have won the race).
// Deleting a VM that is already being deleted is answered by the API as a
// new operation, which is success too.
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	zone, name, err := parseProviderID(providerID)
	if err != nil {
		return err
	}
	_, err = p.client.Delete(ctx, &computepb.DeleteInstanceRequest{Project: p.cfg.Project, Zone: zone, Instance: name}, p.noRetry)
	if err == nil {
		return nil
	}
	c := classify("deleting instance "+providerID, err)
	if errors.Is(c, providers.ErrNotFound) {
		return nil
	}
	return c
}

// managedFilter selects proxyfleet's VMs in an aggregated list.
const managedFilter = "labels." + LabelManagedBy + " = " + ManagedBy

// ListByTag lists every proxyfleet VM in the project, in every zone and not
// only the configured one (a zone edit leaves VMs behind in the old zone),
// following every page. A scope carrying a warning is skipped — that is how
// the API reports zones without matches — except UNREACHABLE: a zone that
// could not be read may hide VMs, and the contract forbids a partial list.
// Any error fails the whole list.
func (p *Provider) ListByTag(ctx context.Context) ([]providers.Instance, error) {
	it := p.client.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
		Project: p.cfg.Project, Filter: proto.String(managedFilter),
	}, p.noRetry)
	var out []providers.Instance
	for {
		pair, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, classify("listing managed instances", err)
		}
		scope := pair.Value
		if w := scope.GetWarning(); w != nil {
			if w.GetCode() == computepb.Warning_UNREACHABLE.String() {
				return nil, fmt.Errorf("%w: listing managed instances: scope %s is unreachable: %s", providers.ErrTransient, pair.Key, w.GetMessage())
			}
			continue
		}
		zone := strings.TrimPrefix(pair.Key, "zones/")
		for _, ins := range scope.GetInstances() {
			if ins.GetLabels()[LabelManagedBy] != ManagedBy {
				continue // the filter already excludes these; never trust a list blindly
			}
			z := zone
			if zu := ins.GetZone(); zu != "" {
				z = lastSegment(zu)
			}
			inst := p.instanceOf(ins, z)
			inst.Parts = []string{providers.PartVM}
			out = append(out, inst)
		}
	}
}

// Check fetches a single page of at most one managed VM from the aggregated
// list: that proves the credentials, that the Compute API is enabled and that
// the controller may list instances, which ListByTag and GC rely on. The
// SDK treats maxResults as a page size and would drain every page, so the
// check takes one page explicitly. One target per entry: the project.
func (p *Provider) Check(ctx context.Context) []providers.TargetStatus {
	it := p.client.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
		Project: p.cfg.Project, Filter: proto.String(managedFilter), MaxResults: proto.Uint32(1),
	}, p.noRetry)
	var page []compute.InstancesScopedListPair
	_, err := iterator.NewPager(it, 1, "").NextPage(&page)
	st := providers.TargetStatus{Target: p.cfg.Project, Details: map[string]string{"project": p.cfg.Project, "addressType": p.cfg.AddressType}}
	if z := p.cfg.Defaults.Zone; z != "" {
		st.Details["defaultZone"] = z
	}
	st.Ready, st.Reason, st.Message = checkVerdict(err)
	return []providers.TargetStatus{st}
}

// instanceOf maps a VM onto the contract: the state from its status, the
// address of the configured type once it has one.
func (p *Provider) instanceOf(ins *computepb.Instance, zone string) providers.Instance {
	out := providers.Instance{
		ProviderID:   formatProviderID(zone, ins.GetName()),
		Name:         ins.GetName(),
		OwnerUID:     ins.GetLabels()[LabelOwnerUID],
		Installation: ins.GetLabels()[LabelInstallation],
	}
	if t, err := time.Parse(time.RFC3339, ins.GetCreationTimestamp()); err == nil {
		out.CreatedAt = t
	}
	ip := addressOf(ins, p.cfg.AddressType)
	out.State = stateOf(ins.GetStatus(), ip != "")
	if out.State == providers.StateRunning {
		out.IP = ip
	}
	return out
}

// addressOf is the VM's NAT IP (external) or VPC address (internal) on its
// first interface, "" while it has none.
func addressOf(ins *computepb.Instance, addressType string) string {
	nics := ins.GetNetworkInterfaces()
	if len(nics) == 0 {
		return ""
	}
	if addressType == AddressInternal {
		return nics[0].GetNetworkIP()
	}
	for _, ac := range nics[0].GetAccessConfigs() {
		if ip := ac.GetNatIP(); ip != "" {
			return ip
		}
	}
	return ""
}

// stateOf maps a Compute Engine instance status. RUNNING without the chosen
// address is still provisioning (the gateways cannot reach it yet). Unknown
// statuses are Stopped: the reconciler deletes and recreates, the safe move
// for cattle when the API grows a state this code has never seen.
func stateOf(status string, hasAddress bool) providers.State {
	switch status {
	case "RUNNING":
		if hasAddress {
			return providers.StateRunning
		}
		return providers.StateProvisioning
	case "PROVISIONING", "STAGING":
		return providers.StateProvisioning
	case "STOPPING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED":
		return providers.StateStopped
	default:
		return providers.StateStopped
	}
}

// formatProviderID returns "zones/<zone>/instances/<name>". The zone is part
// of the ID so Get and Delete reach the right VM even after the Proxy's zone
// was edited and its replacement is being made elsewhere.
func formatProviderID(zone, name string) string {
	return "zones/" + zone + "/instances/" + name
}

// parseProviderID parses "zones/<zone>/instances/<name>" strictly. Anything
// else is ErrPermanent, since retrying cannot make it parse.
func parseProviderID(id string) (zone, name string, err error) {
	parts := strings.Split(id, "/")
	if len(parts) != 4 || parts[0] != "zones" || parts[2] != "instances" ||
		!zonePattern.MatchString(parts[1]) || !namePattern.MatchString(parts[3]) {
		return "", "", fmt.Errorf("%w: invalid providerID %q: want zones/<zone>/instances/<name>", providers.ErrPermanent, id)
	}
	return parts[1], parts[3], nil
}

func lastSegment(s string) string {
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[i+1:]
	}
	return s
}
