// Package digitalocean is the provider that runs each upstream proxy as a
// DigitalOcean droplet: one droplet per Proxy, so every Proxy has an egress
// address of its own.
//
// DigitalOcean has no idempotency key, so Create looks the Proxy's droplet
// up by its deterministic name and its owner tag before it creates one: a
// Create retried after a lost answer (a 500 after the droplet was made, a
// timeout, a controller restart) finds the droplet the first attempt made
// instead of making a second. It returns once DigitalOcean accepted the
// create; the reconciler finds readiness by polling Get, as for every
// provider. A droplet booted with the provider's own cloud-init runs a
// Squid that demands the per-Proxy login the controller generated, behind
// a cloud firewall that admits the proxy port from the gateways' ranges
// only, so a droplet on a public address is never an open proxy.
//
// It owns its block of the providers config file (config.go: Type,
// ReadConfig), which the binary's composition root wires to the type name.
// It imports the providers contract, providers/bootstrap and
// providers/keyedlock, never another provider, the controller or cmd.
package digitalocean

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/godo"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/keyedlock"
)

// Constructor returns the registry constructor for type digitalocean.
func Constructor() providers.Constructor {
	return func(e providers.Entry) (providers.Provider, error) {
		cfg, err := ReadConfig(e)
		if err != nil {
			return nil, err
		}
		return New(cfg)
	}
}

// Provider runs Squid droplets. It is safe for concurrent use; it keeps no
// state beyond its configuration, its client and the per-firewall locks.
type Provider struct {
	client *godo.Client
	cfg    Config
	locks  keyedlock.Locks
}

var (
	_ providers.Provider         = (*Provider)(nil)
	_ providers.Checker          = (*Provider)(nil)
	_ providers.AuthBootstrapper = (*Provider)(nil)
	_ providers.Pricer           = (*Provider)(nil)
)

// New returns a provider creating droplets as cfg describes.
func New(cfg Config) (*Provider, error) {
	if cfg.AddressType == "" {
		cfg.AddressType = AddressPublic
	}
	if problems := cfg.validate(); len(problems) > 0 {
		return nil, fmt.Errorf("digitalocean provider: %w", providers.Problems(problems))
	}
	c, err := newClient(cfg, tracedTransport())
	if err != nil {
		return nil, fmt.Errorf("digitalocean provider: %w", err)
	}
	return &Provider{client: c, cfg: cfg}, nil
}

// BootstrapRequiresAuth is true: the droplet's Squid is reachable from
// outside the cluster, so the bootstrap always demands per-Proxy
// credentials.
func (p *Provider) BootstrapRequiresAuth() bool { return true }

// HourlyPrice is the entry's configured price of one droplet for an hour,
// 0 when none is configured.
func (p *Provider) HourlyPrice() float64 { return p.cfg.HourlyPrice }

// Create makes the droplet for req unless it exists, and returns without
// waiting for it to run. The look-up is by the deterministic name and the
// owner tag: DigitalOcean lists a droplet from the moment it accepts its
// create, so a Create whose answer was lost finds its droplet on the
// retry. The managed firewall is brought up to date first.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (providers.Instance, error) {
	s, err := buildSpec(p.cfg, req)
	if err != nil {
		return providers.Instance{}, err
	}
	if err := p.ensureFirewall(ctx, req); err != nil {
		return providers.Instance{}, err
	}
	existing, err := p.find(ctx, req.Name, req.OwnerUID)
	if err != nil {
		return providers.Instance{}, err
	}
	if existing != nil {
		return p.instanceOf(*existing), nil
	}
	d, _, err := p.client.Droplets.Create(ctx, createRequest(p.cfg, req.Name, s))
	if err != nil {
		return providers.Instance{}, classify("creating droplet "+req.Name, err)
	}
	return p.instanceOf(*d), nil
}

// find returns the live droplet named name tagged as uid's, or nil. A
// droplet of that name without proxyfleet's tags is someone else's and
// never taken over.
func (p *Provider) find(ctx context.Context, name, uid string) (*godo.Droplet, error) {
	opt := &godo.ListOptions{Page: 1, PerPage: 200}
	for {
		page, resp, err := p.client.Droplets.ListByName(ctx, name, opt)
		if err != nil {
			return nil, classify("looking up droplet "+name, err)
		}
		for i := range page {
			d := &page[i]
			if d.Name == name && slices.Contains(d.Tags, TagManaged) && slices.Contains(d.Tags, TagOwnerUIDPrefix+uid) && d.Status != "archive" {
				return d, nil
			}
		}
		if resp == nil || resp.Links == nil || resp.Links.IsLastPage() || len(page) == 0 {
			return nil, nil
		}
		opt.Page++
	}
}

// Get observes the droplet providerID names. A missing droplet, one being
// archived, or one not managed by proxyfleet is ErrNotFound.
func (p *Provider) Get(ctx context.Context, providerID string) (providers.Instance, error) {
	id, err := parseProviderID(providerID)
	if err != nil {
		return providers.Instance{}, err
	}
	d, _, err := p.client.Droplets.Get(ctx, id)
	if err != nil {
		return providers.Instance{}, classify("getting droplet "+providerID, err)
	}
	switch {
	case !slices.Contains(d.Tags, TagManaged):
		return providers.Instance{}, fmt.Errorf("%w: droplet %s is not managed by proxyfleet", providers.ErrNotFound, providerID)
	case d.Status == "archive":
		return providers.Instance{}, fmt.Errorf("%w: droplet %s is archived", providers.ErrNotFound, providerID)
	}
	return p.instanceOf(*d), nil
}

// Delete destroys the droplet and returns without waiting. A droplet
// DigitalOcean no longer knows is success: deletion is retried, and the GC
// may have won the race.
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	id, err := parseProviderID(providerID)
	if err != nil {
		return err
	}
	_, err = p.client.Droplets.Delete(ctx, id)
	if err == nil {
		return nil
	}
	c := classify("deleting droplet "+providerID, err)
	if errors.Is(c, providers.ErrNotFound) {
		return nil
	}
	return c
}

// ListByTag lists every droplet tagged TagManaged in the account, in every
// region, following every page. Any error fails the whole list.
func (p *Provider) ListByTag(ctx context.Context) ([]providers.Instance, error) {
	opt := &godo.ListOptions{Page: 1, PerPage: 200}
	var out []providers.Instance
	for {
		page, resp, err := p.client.Droplets.ListByTag(ctx, TagManaged, opt)
		if err != nil {
			return nil, classify("listing managed droplets", err)
		}
		for _, d := range page {
			if !slices.Contains(d.Tags, TagManaged) || d.Status == "archive" {
				continue // the tag already selects these; never trust a list blindly
			}
			inst := p.instanceOf(d)
			inst.Parts = []string{providers.PartVM}
			out = append(out, inst)
		}
		if resp == nil || resp.Links == nil || resp.Links.IsLastPage() || len(page) == 0 {
			return out, nil
		}
		opt.Page++
	}
}

// Check lists one managed droplet on a client and connection of its own,
// so a pooled connection that still works cannot hide an endpoint that
// stopped answering: that proves the token and the droplet:read scope
// ListByTag and the GC rely on. One target per entry: the region.
func (p *Provider) Check(ctx context.Context) []providers.TargetStatus {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	defer transport.CloseIdleConnections()
	st := providers.TargetStatus{Target: p.cfg.Region, Details: map[string]string{"region": p.cfg.Region, "addressType": p.cfg.AddressType}}
	c, err := newClient(p.cfg, transport)
	if err == nil {
		_, _, err = c.Droplets.ListByTag(ctx, TagManaged, &godo.ListOptions{Page: 1, PerPage: 1})
	}
	st.Ready, st.Reason, st.Message = checkVerdict(err)
	return []providers.TargetStatus{st}
}

// instanceOf maps a droplet onto the contract: the state from its status,
// the address of the configured type once it has one.
func (p *Provider) instanceOf(d godo.Droplet) providers.Instance {
	out := providers.Instance{
		ProviderID:   formatProviderID(d.ID),
		Name:         d.Name,
		OwnerUID:     tagValue(d.Tags, TagOwnerUIDPrefix),
		Installation: tagValue(d.Tags, TagInstallationPrefix),
	}
	if t, err := time.Parse(time.RFC3339, d.Created); err == nil {
		out.CreatedAt = t
	}
	ip := addressOf(d, p.cfg.AddressType)
	out.State = stateOf(d.Status, ip != "")
	if out.State == providers.StateRunning {
		out.IP = ip
	}
	return out
}

// addressOf is the droplet's public IPv4 address, or its public IPv6
// address when it has no public IPv4 (public), or its VPC address
// (private); "" while it has none.
func addressOf(d godo.Droplet, addressType string) string {
	if d.Networks == nil {
		return ""
	}
	want := "public"
	if addressType == AddressPrivate {
		want = "private"
	}
	for _, n := range d.Networks.V4 {
		if n.Type == want && n.IPAddress != "" {
			return n.IPAddress
		}
	}
	if want == "public" {
		for _, n := range d.Networks.V6 {
			if n.Type == "public" && n.IPAddress != "" {
				return n.IPAddress
			}
		}
	}
	return ""
}

// stateOf maps a droplet status. Active without the chosen address is
// still provisioning; off is Stopped (the reconciler replaces it); archive
// never reaches here (Get calls it NotFound). Unknown statuses are
// Stopped: the reconciler deletes and recreates, the safe move for cattle
// when the API grows a status this code has never seen.
func stateOf(status string, hasAddress bool) providers.State {
	switch status {
	case "active":
		if hasAddress {
			return providers.StateRunning
		}
		return providers.StateProvisioning
	case "new":
		return providers.StateProvisioning
	case "archive":
		return providers.StateTerminated
	default:
		return providers.StateStopped
	}
}

// providerIDPrefix starts every providerID, as Kubernetes' DigitalOcean
// cloud controller spells a node's: digitalocean://<droplet-id>.
const providerIDPrefix = "digitalocean://"

// formatProviderID returns "digitalocean://<droplet-id>".
func formatProviderID(id int) string {
	return providerIDPrefix + strconv.Itoa(id)
}

// parseProviderID parses "digitalocean://<droplet-id>" strictly. Anything
// else is ErrPermanent, since retrying cannot make it parse.
func parseProviderID(providerID string) (int, error) {
	rest, ok := strings.CutPrefix(providerID, providerIDPrefix)
	id, err := strconv.Atoi(rest)
	if !ok || err != nil || id < 1 || strconv.Itoa(id) != rest {
		return 0, fmt.Errorf("%w: invalid providerID %q: want digitalocean://<droplet-id>", providers.ErrPermanent, providerID)
	}
	return id, nil
}
