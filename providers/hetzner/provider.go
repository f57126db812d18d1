// Package hetzner is the provider that runs each upstream proxy as a
// Hetzner Cloud server: one server per Proxy, so every Proxy has an
// egress address of its own (a public IPv4 address, and a /64 of IPv6).
//
// Hetzner Cloud has no idempotency key, so Create looks the Proxy's server
// up by its deterministic name (server names are unique in a project)
// before it creates one, and a create refused as a duplicate name looks
// again: a Create retried after a lost answer (a 500 after the server was
// made, a timeout, a controller restart) finds the server the first
// attempt made instead of making a second. It returns once Hetzner
// accepted the create; the reconciler finds readiness by polling Get. A
// server booted with the provider's own cloud-init runs a Squid that
// demands the per-Proxy login the controller generated, behind a firewall
// that admits the proxy port from the gateways' ranges only, so a server
// on a public address is never an open proxy.
//
// It owns its block of the providers config file (config.go: Type,
// ReadConfig), which the binary's composition root wires to the type name.
// It imports the providers contract, providers/bootstrap and
// providers/keyedlock, never another provider, the controller or cmd.
package hetzner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/keyedlock"
)

// Constructor returns the registry constructor for type hetzner.
func Constructor() providers.Constructor {
	return func(e providers.Entry) (providers.Provider, error) {
		cfg, err := ReadConfig(e)
		if err != nil {
			return nil, err
		}
		return New(cfg)
	}
}

// Provider runs Squid servers in one project. It is safe for concurrent
// use; it keeps no state beyond its configuration, its client and the
// per-firewall locks.
type Provider struct {
	client *hcloud.Client
	cfg    Config
	locks  keyedlock.Locks
}

var (
	_ providers.Provider         = (*Provider)(nil)
	_ providers.Checker          = (*Provider)(nil)
	_ providers.AuthBootstrapper = (*Provider)(nil)
	_ providers.Pricer           = (*Provider)(nil)
)

// New returns a provider creating servers as cfg describes.
func New(cfg Config) (*Provider, error) {
	if problems := cfg.validate(); len(problems) > 0 {
		return nil, fmt.Errorf("hetzner provider: %w", providers.Problems(problems))
	}
	return &Provider{client: newClient(cfg, tracedTransport()), cfg: cfg}, nil
}

// BootstrapRequiresAuth is true: the server's Squid is reachable from
// outside the cluster, so the bootstrap always demands per-Proxy
// credentials.
func (p *Provider) BootstrapRequiresAuth() bool { return true }

// HourlyPrice is the entry's configured price of one server for an hour,
// 0 when none is configured.
func (p *Provider) HourlyPrice() float64 { return p.cfg.HourlyPrice }

// Create makes the server for req unless it exists, and returns without
// waiting for it to run. The look-up is by the deterministic name, unique
// in a project; the server found must carry the Proxy's UID label. A
// create Hetzner refuses as a duplicate name (the look-up raced a create
// whose answer is still on its way) looks again. The managed firewall is
// brought up to date first and applied to the server from its creation.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (providers.Instance, error) {
	s, err := buildSpec(p.cfg, req)
	if err != nil {
		return providers.Instance{}, err
	}
	fw, err := p.ensureFirewall(ctx, req)
	if err != nil {
		return providers.Instance{}, err
	}
	if inst, found, err := p.find(ctx, req); err != nil || found {
		return inst, err
	}
	res, _, err := p.client.Server.Create(ctx, createOpts(p.cfg, req.Name, s, fw))
	switch {
	case codeOf(err) == hcloud.ErrorCodeUniquenessError:
		if inst, found, ferr := p.find(ctx, req); ferr != nil || found {
			return inst, ferr
		}
		return providers.Instance{}, fmt.Errorf("%w: creating server %s: %w", providers.ErrTransient, req.Name, err)
	case err != nil:
		c := classify("creating server "+req.Name, err)
		if errors.Is(c, providers.ErrNotFound) {
			// A create names things that must exist (the firewall, the
			// SSH keys): their absence is no absence of the server.
			return providers.Instance{}, fmt.Errorf("%w: %w", providers.ErrPermanent, c)
		}
		return providers.Instance{}, c
	case res.Server == nil:
		return providers.Instance{}, fmt.Errorf("%w: creating server %s: the answer holds no server", providers.ErrTransient, req.Name)
	}
	return p.instanceOf(res.Server), nil
}

// find looks up the server named req.Name. found is false when there is
// none (or it is being deleted); a server of that name that is not req's
// Proxy's is ErrPermanent: server names are unique in a project, so no
// server of req can be made beside it.
func (p *Provider) find(ctx context.Context, req providers.CreateRequest) (providers.Instance, bool, error) {
	servers, _, err := p.client.Server.List(ctx, hcloud.ServerListOpts{Name: req.Name})
	if err != nil {
		return providers.Instance{}, false, classify("looking up server "+req.Name, err)
	}
	for _, srv := range servers {
		switch {
		case srv.Name != req.Name || srv.Status == hcloud.ServerStatusDeleting:
			continue
		case srv.Labels[LabelManagedBy] != ManagedBy || srv.Labels[LabelOwnerUID] != req.OwnerUID:
			return providers.Instance{}, false, fmt.Errorf("%w: server %s (%d) exists but is not this Proxy's (labels %v); refusing to adopt it",
				providers.ErrPermanent, srv.Name, srv.ID, srv.Labels)
		}
		return p.instanceOf(srv), true, nil
	}
	return providers.Instance{}, false, nil
}

// Get observes the server providerID names. A missing server, or one not
// managed by proxyfleet, is ErrNotFound.
func (p *Provider) Get(ctx context.Context, providerID string) (providers.Instance, error) {
	id, err := parseProviderID(providerID)
	if err != nil {
		return providers.Instance{}, err
	}
	srv, _, err := p.client.Server.GetByID(ctx, id)
	switch {
	case err != nil:
		return providers.Instance{}, classify("getting server "+providerID, err)
	case srv == nil:
		return providers.Instance{}, fmt.Errorf("%w: server %s does not exist", providers.ErrNotFound, providerID)
	case srv.Labels[LabelManagedBy] != ManagedBy:
		return providers.Instance{}, fmt.Errorf("%w: server %s is not managed by proxyfleet", providers.ErrNotFound, providerID)
	}
	return p.instanceOf(srv), nil
}

// Delete deletes the server and returns without waiting. A server Hetzner
// no longer knows is success: deletion is retried, and the GC may have
// won the race.
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	id, err := parseProviderID(providerID)
	if err != nil {
		return err
	}
	_, _, err = p.client.Server.DeleteWithResult(ctx, &hcloud.Server{ID: id})
	if err == nil {
		return nil
	}
	c := classify("deleting server "+providerID, err)
	if errors.Is(c, providers.ErrNotFound) {
		return nil
	}
	return c
}

// managedSelector selects proxyfleet's servers.
const managedSelector = LabelManagedBy + "=" + ManagedBy

// ListByTag lists every server of the project labelled as proxyfleet's,
// in every location, following every page. Any error fails the whole list.
func (p *Provider) ListByTag(ctx context.Context) ([]providers.Instance, error) {
	opts := hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{Page: 1, PerPage: 50, LabelSelector: managedSelector}}
	var out []providers.Instance
	for {
		page, resp, err := p.client.Server.List(ctx, opts)
		if err != nil {
			return nil, classify("listing managed servers", err)
		}
		for _, srv := range page {
			if srv.Labels[LabelManagedBy] != ManagedBy {
				continue // the selector already excludes these; never trust a list blindly
			}
			inst := p.instanceOf(srv)
			inst.Parts = []string{providers.PartVM}
			out = append(out, inst)
		}
		if resp == nil || resp.Meta.Pagination == nil || resp.Meta.Pagination.NextPage == 0 || len(page) == 0 {
			return out, nil
		}
		opts.Page = resp.Meta.Pagination.NextPage
	}
}

// Check lists one managed server on a client and connection of its own,
// so a pooled connection that still works cannot hide an endpoint that
// stopped answering: that proves the token ListByTag and the GC rely on.
// One target per entry: the location.
func (p *Provider) Check(ctx context.Context) []providers.TargetStatus {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	defer transport.CloseIdleConnections()
	c := newClient(p.cfg, transport)
	_, _, err := c.Server.List(ctx, hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{Page: 1, PerPage: 1, LabelSelector: managedSelector}})
	st := providers.TargetStatus{Target: p.cfg.Location, Details: map[string]string{"location": p.cfg.Location}}
	if p.cfg.IPv6Only {
		st.Details["ipv6Only"] = "true"
	}
	st.Ready, st.Reason, st.Message = checkVerdict(err)
	return []providers.TargetStatus{st}
}

// instanceOf maps a server onto the contract: the state from its status,
// its public address once it has one.
func (p *Provider) instanceOf(srv *hcloud.Server) providers.Instance {
	out := providers.Instance{
		ProviderID:   formatProviderID(srv.ID),
		Name:         srv.Name,
		OwnerUID:     srv.Labels[LabelOwnerUID],
		Installation: srv.Labels[LabelInstallation],
		CreatedAt:    srv.Created,
	}
	ip := addressOf(srv)
	out.State = stateOf(srv.Status, ip != "")
	if out.State == providers.StateRunning {
		out.IP = ip
	}
	return out
}

// addressOf is the server's public IPv4 address, or the first address of
// its /64 (Hetzner's images configure <prefix>::1) when it has no IPv4;
// "" while it has neither.
func addressOf(srv *hcloud.Server) string {
	if ip := srv.PublicNet.IPv4.IP; len(ip) > 0 && !ip.IsUnspecified() {
		return ip.String()
	}
	if n := srv.PublicNet.IPv6.Network; n != nil && len(n.IP) == net.IPv6len {
		ip := make(net.IP, net.IPv6len)
		copy(ip, n.IP.Mask(n.Mask))
		ip[15] |= 1
		return ip.String()
	}
	return ""
}

// stateOf maps a server status. Running without an address is still
// provisioning; initializing, starting, and the moves Hetzner makes on its
// own (migrating, rebuilding) are Provisioning; deleting is Terminated;
// stopping, off and any status Hetzner may add are Stopped: the reconciler
// deletes and recreates, the safe move for cattle.
func stateOf(status hcloud.ServerStatus, hasAddress bool) providers.State {
	switch status {
	case hcloud.ServerStatusRunning:
		if hasAddress {
			return providers.StateRunning
		}
		return providers.StateProvisioning
	case hcloud.ServerStatusInitializing, hcloud.ServerStatusStarting, hcloud.ServerStatusMigrating, hcloud.ServerStatusRebuilding:
		return providers.StateProvisioning
	case hcloud.ServerStatusDeleting:
		return providers.StateTerminated
	default:
		return providers.StateStopped
	}
}

// providerIDPrefix starts every providerID, as Kubernetes' Hetzner cloud
// controller spells a node's: hcloud://<server-id>.
const providerIDPrefix = "hcloud://"

// formatProviderID returns "hcloud://<server-id>".
func formatProviderID(id int64) string {
	return providerIDPrefix + strconv.FormatInt(id, 10)
}

// parseProviderID parses "hcloud://<server-id>" strictly. Anything else is
// ErrPermanent, since retrying cannot make it parse.
func parseProviderID(providerID string) (int64, error) {
	rest, ok := strings.CutPrefix(providerID, providerIDPrefix)
	id, err := strconv.ParseInt(rest, 10, 64)
	if !ok || err != nil || id < 1 || strconv.FormatInt(id, 10) != rest {
		return 0, fmt.Errorf("%w: invalid providerID %q: want hcloud://<server-id>", providers.ErrPermanent, providerID)
	}
	return id, nil
}
