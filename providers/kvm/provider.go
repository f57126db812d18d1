// Package kvm is the provider that runs each upstream proxy as a libvirt
// guest on hypervisors reached over SSH, with the libvirt socket forwarded
// through the SSH session: nothing to expose on a host beyond sshd, and no
// cgo or libvirt libraries in the controller.
//
// Per guest it keeps a cloud image cached in the host's storage pool
// (downloaded by the controller, verified, marked as complete last), a
// qcow2 overlay backed by it, and a NoCloud seed ISO carrying the Proxy's
// cloud-init — or, without one, the shared Squid bootstrap with the
// Proxy's generated login, so the guest is never an open proxy. Every
// Create step is idempotent, so a Create cut off anywhere is finished by the
// next one. docs/providers/kvm.md is the user guide.
//
// It owns its block of the providers config file (config.go: Type,
// ReadConfig), which the binary's composition root wires to the type name.
// It imports the providers contract and the shared providers/bootstrap,
// nocloud and keyedlock, never another provider, the controller or cmd.
package kvm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
	"github.com/proxyfleet/proxyfleet/providers/keyedlock"
	"github.com/proxyfleet/proxyfleet/providers/nocloud"
)

// seedSlack is the room the seed ISO needs beside the disk in the quota check.
const seedSlack = 16 << 20

// startWatch is how long Create watches a freshly started domain: one that
// is dead by then will not come up by retrying the same start.
const startWatch = 3 * time.Second

// Constructor returns the registry constructor for type kvm. log is the
// controller's logger.
func Constructor(log logr.Logger) providers.Constructor {
	return func(e providers.Entry) (providers.Provider, error) {
		cfg, err := ReadConfig(e)
		if err != nil {
			return nil, err
		}
		cfg.Log = log.WithValues("provider", e.Name)
		return New(cfg)
	}
}

// Provider runs guests on the configured hosts. It is safe for concurrent
// use: one pooled connection per host, per-name locks so concurrent Creates
// and Deletes of one guest serialise, per-image locks so one download
// serves every Create waiting for it.
type Provider struct {
	cfg    Config
	login  sshLogin
	hosts  map[string]*Host
	conns  map[string]*hostConn
	names  keyedlock.Locks
	images keyedlock.Locks
	// now is the clock for the createdAt mark.
	now func() time.Time

	closeOnce sync.Once
}

var (
	_ providers.Provider         = (*Provider)(nil)
	_ providers.Checker          = (*Provider)(nil)
	_ providers.AuthBootstrapper = (*Provider)(nil)
)

// New validates cfg, applies defaults and returns a provider. It does not
// dial: a host that is down, or an SSH Secret not mounted yet, must not keep
// the controller (and every other provider) from starting. Missing key or
// known_hosts files are logged as a warning.
func New(cfg Config) (*Provider, error) {
	if cfg.Entry == "" || !identifier.MatchString(cfg.Entry) {
		return nil, fmt.Errorf("kvm provider: the entry name %q is not a plain identifier (it is part of image file names)", cfg.Entry)
	}
	if cfg.User == "" || cfg.KeyFile == "" || cfg.KnownHosts == "" {
		return nil, errors.New("kvm provider: the SSH user, key file and known_hosts file are required")
	}
	if len(cfg.Hosts) == 0 {
		return nil, errors.New("kvm provider: at least one host is required")
	}
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket
	}
	if cfg.DomainType == "" {
		cfg.DomainType = DomainKVM
	}
	if cfg.DomainType != DomainKVM && cfg.DomainType != DomainQEMU {
		return nil, fmt.Errorf("kvm provider: domainType %q is not kvm or qemu", cfg.DomainType)
	}
	if err := checkCPUMode(cfg.DomainType, cfg.CPUMode); err != nil {
		return nil, fmt.Errorf("kvm provider: %w", err)
	}
	def := DefaultBudgets()
	for _, b := range []struct{ v, d *time.Duration }{
		{&cfg.Budgets.Dial, &def.Dial}, {&cfg.Budgets.RPC, &def.RPC}, {&cfg.Budgets.DomainCreate, &def.DomainCreate},
		{&cfg.Budgets.SeedUpload, &def.SeedUpload}, {&cfg.Budgets.ImageTransfer, &def.ImageTransfer},
	} {
		if *b.v <= 0 {
			*b.v = *b.d
		}
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	p := &Provider{cfg: cfg, hosts: map[string]*Host{}, conns: map[string]*hostConn{}, now: time.Now,
		login: sshLogin{User: cfg.User, KeyFile: cfg.KeyFile, KnownHostsFile: cfg.KnownHosts, Socket: cfg.Socket}}
	for i := range cfg.Hosts {
		h := cfg.Hosts[i]
		if !identifier.MatchString(h.Name) {
			return nil, fmt.Errorf("kvm provider: host name %q is not a plain identifier (it is part of providerIDs)", h.Name)
		}
		if _, dup := p.hosts[h.Name]; dup {
			return nil, fmt.Errorf("kvm provider: host %q is configured twice", h.Name)
		}
		if h.Pool == "" {
			h.Pool = "default"
		}
		if h.Network == "" && h.Bridge == "" {
			h.Network = "default"
		}
		p.hosts[h.Name] = &h
		p.conns[h.Name] = newHostConn(h.Name, h.Address)
	}
	for key, img := range cfg.Images {
		if !identifier.MatchString(key) {
			return nil, fmt.Errorf("kvm provider: image key %q is not a plain identifier (it is part of file names)", key)
		}
		if img.Format == "" {
			img.Format = "qcow2"
		}
		if img.Firmware == "" {
			img.Firmware = FirmwareUEFI
		}
		cfg.Images[key] = img
	}
	for _, f := range []string{cfg.KeyFile, cfg.KnownHosts} {
		if _, err := statFile(f); err != nil {
			cfg.Log.Info("WARNING: kvm SSH file is not readable yet; hosts stay unreachable until it is", "file", f, "error", err.Error())
		}
	}
	return p, nil
}

// Close drops every pooled connection. The controller calls it on shutdown;
// calls after Close redial.
func (p *Provider) Close() {
	p.closeOnce.Do(func() {
		for _, c := range p.conns {
			c.closeAll()
		}
	})
}

// BootstrapRequiresAuth is true: a guest on a bridge or a routed network is
// reachable beyond the cluster, so the bootstrap's Squid always demands the
// Proxy's generated login.
func (p *Provider) BootstrapRequiresAuth() bool { return true }

// placement is a Create request resolved against the config.
type placement struct {
	host     *Host
	imageKey string
	image    Image
	machine  MachineType
}

// resolve picks host, image and machine type, before any dial: a wrong
// placement is Permanent and must not cost a connection.
func (p *Provider) resolve(pl providers.Placement) (placement, error) {
	zone, img, mt := pl.Zone, pl.Image, pl.MachineType
	if zone == "" {
		zone = p.cfg.Defaults.Zone
	}
	if zone == "" && len(p.cfg.Hosts) == 1 {
		zone = p.cfg.Hosts[0].Name
	}
	if img == "" {
		img = p.cfg.Defaults.Image
	}
	if mt == "" {
		mt = p.cfg.Defaults.MachineType
	}
	var out placement
	h, ok := p.hosts[zone]
	switch {
	case zone == "":
		return out, fmt.Errorf("%w: placement.zone is required (one of the hosts %v)", providers.ErrPermanent, p.hostNames())
	case !ok:
		return out, fmt.Errorf("%w: placement.zone %q is not a configured host (want one of %v)", providers.ErrPermanent, zone, p.hostNames())
	}
	out.host = h
	image, ok := p.cfg.Images[img]
	if !ok {
		return out, fmt.Errorf("%w: placement.image %q is not a key of the entry's images (want one of %v)", providers.ErrPermanent, img, slices.Sorted(maps.Keys(p.cfg.Images)))
	}
	out.imageKey, out.image = img, image
	machine, ok := p.cfg.MachineTypes[mt]
	if !ok {
		return out, fmt.Errorf("%w: placement.machineType %q is not a key of the entry's machineTypes (want one of %v)", providers.ErrPermanent, mt, slices.Sorted(maps.Keys(p.cfg.MachineTypes)))
	}
	out.machine = machine
	return out, nil
}

func (p *Provider) hostNames() []string {
	out := make([]string, 0, len(p.cfg.Hosts))
	for _, h := range p.cfg.Hosts {
		out = append(out, h.Name)
	}
	return out
}

// seedFor builds the guest's seed: the Proxy's own cloud-init byte for byte,
// or the shared Squid bootstrap with its login; the guest-agent script and
// the configured vendor-data as vendor-data.
func (p *Provider) seedFor(req providers.CreateRequest) ([]byte, error) {
	userData := req.CloudInit
	if len(userData) == 0 {
		if req.ProxyAuth == nil || req.ProxyAuth.Username == "" || req.ProxyAuth.Password == "" {
			return nil, fmt.Errorf("%w: the proxyfleet bootstrap needs proxy credentials and none were given (refusing to boot an open proxy)", providers.ErrPermanent)
		}
		ud, err := bootstrap.Squid(req.Name, req.Port, *req.ProxyAuth)
		if err != nil {
			return nil, fmt.Errorf("%w: building the bootstrap cloud-init: %v", providers.ErrPermanent, err)
		}
		userData = ud
	}
	vd, err := nocloud.VendorData(p.cfg.GuestAgent, p.cfg.VendorData)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", providers.ErrPermanent, err)
	}
	iso, err := nocloud.BuildISO(nocloud.Seed{InstanceID: req.Name, Hostname: req.Name, UserData: userData, VendorData: vd})
	if err != nil {
		// A read-only temp directory is the usual cause: fixed by an admin.
		return nil, fmt.Errorf("%w: building the seed ISO: %v", providers.ErrPermanent, err)
	}
	return iso, nil
}

// callV runs fn on host's pooled connection under budget.
func callV[T any](ctx context.Context, p *Provider, host, op string, budget time.Duration, fn func(api) (T, error)) (T, error) {
	var zero T
	c, ok := p.conns[host]
	if !ok {
		return zero, fmt.Errorf("%w: host %q is not configured", providers.ErrPermanent, host)
	}
	l, err := c.get(ctx, p.login, p.cfg.Budgets.Dial, p.cfg.Log)
	if err != nil {
		return zero, err
	}
	return runV(ctx, l, op, budget, fn)
}

// rpcV is callV with the ordinary RPC budget.
func rpcV[T any](ctx context.Context, p *Provider, host, op string, fn func(api) (T, error)) (T, error) {
	return callV(ctx, p, host, op, p.cfg.Budgets.RPC, fn)
}

// call is callV for calls that return only an error.
func (p *Provider) call(ctx context.Context, host, op string, budget time.Duration, fn func(api) error) error {
	_, err := callV(ctx, p, host, op, budget, func(a api) (struct{}, error) { return struct{}{}, fn(a) })
	return err
}

// rpc is call with the ordinary RPC budget.
func (p *Provider) rpc(ctx context.Context, host, op string, fn func(api) error) error {
	return p.call(ctx, host, op, p.cfg.Budgets.RPC, fn)
}

// lookupDomain returns the domain and whether it exists.
func (p *Provider) lookupDomain(ctx context.Context, host, name string) (libvirt.Domain, bool, error) {
	dom, err := rpcV(ctx, p, host, "DomainLookupByName", func(a api) (libvirt.Domain, error) { return a.DomainLookupByName(name) })
	if isCode(err, libvirt.ErrNoDomain) {
		return dom, false, nil
	}
	if err != nil {
		return dom, false, classify("looking up domain "+name, err)
	}
	return dom, true, nil
}

// readMark returns the domain's proxyfleet mark; ok is false for a domain
// that has none (someone else's).
func (p *Provider) readMark(ctx context.Context, host string, dom libvirt.Domain) (Mark, bool, error) {
	raw, err := rpcV(ctx, p, host, "DomainGetMetadata", func(a api) (string, error) {
		return a.DomainGetMetadata(dom, int32(libvirt.DomainMetadataElement), libvirt.OptString{MetadataNS}, 0)
	})
	if isCode(err, libvirt.ErrNoDomainMetadata) {
		return Mark{}, false, nil
	}
	if err != nil {
		return Mark{}, false, classify("reading the metadata of domain "+dom.Name, err)
	}
	m, err := parseMark(raw)
	if err != nil {
		return Mark{}, false, fmt.Errorf("%w: domain %s: %v", providers.ErrPermanent, dom.Name, err)
	}
	return m, m.Managed, nil
}

func (p *Provider) domainState(ctx context.Context, host string, dom libvirt.Domain) (libvirt.DomainState, error) {
	st, _, err := p.domainStateReason(ctx, host, dom)
	return st, err
}

// domainStateReason is the domain's state and libvirt's reason for it (a
// DomainPausedReason when paused, and so on).
func (p *Provider) domainStateReason(ctx context.Context, host string, dom libvirt.Domain) (libvirt.DomainState, int32, error) {
	type stateReason struct{ st, reason int32 }
	sr, err := rpcV(ctx, p, host, "DomainGetState", func(a api) (stateReason, error) {
		st, reason, err := a.DomainGetState(dom, 0)
		return stateReason{st, reason}, err
	})
	if err != nil {
		return 0, 0, classify("reading the state of domain "+dom.Name, err)
	}
	return libvirt.DomainState(sr.st), sr.reason, nil
}

// Create makes the guest for req and either finishes it or undoes what it
// made before it returns an error. Every step is safe to repeat after a
// cut-off (a controller killed mid-Create): an existing domain with our
// mark and req's UID is started if needed and returned; one without our
// mark or with another UID is refused as Permanent. Otherwise: pool space
// is checked (QuotaExceeded when short), the base image ensured, the
// guest's mark volume written first (one with another UID is refused), the
// overlay reused or created, the seed rebuilt (always: an upload cut off
// earlier may have left a truncated one), the domain defined and started,
// and watched briefly (a domain that dies at once is Transient). A step
// that fails after the mark exists tears the guest down again (domain,
// overlay, seed, then the mark), so a refused define or start leaves
// nothing on the host; when the teardown fails too, the error says so and
// the next Create or Delete of the name finishes it.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (providers.Instance, error) {
	if !domainName.MatchString(req.Name) {
		return providers.Instance{}, fmt.Errorf("%w: instance name %q is not a domain name", providers.ErrPermanent, req.Name)
	}
	pl, err := p.resolve(req.Placement)
	if err != nil {
		return providers.Instance{}, err
	}
	host := pl.host.Name
	id := FormatProviderID(host, req.Name)
	unlock, err := p.names.Lock(ctx, host+"/"+req.Name)
	if err != nil {
		return providers.Instance{}, fmt.Errorf("%w: waiting for another operation on %s: %v", providers.ErrTransient, id, err)
	}
	defer unlock()

	dom, exists, err := p.lookupDomain(ctx, host, req.Name)
	if err != nil {
		return providers.Instance{}, err
	}
	if exists {
		return p.adopt(ctx, pl.host, dom, req)
	}
	seed, err := p.seedFor(req)
	if err != nil {
		return providers.Instance{}, err
	}
	pool, err := p.lookupPool(ctx, host, pl.host.Pool)
	if err != nil {
		return providers.Instance{}, err
	}
	diskBytes := uint64(pl.machine.DiskGiB) << 30
	base, err := p.ensureImage(ctx, pl, pool, diskBytes+seedSlack)
	if err != nil {
		return providers.Instance{}, err
	}
	mark := Mark{Managed: true, UID: req.OwnerUID, CreatedAt: p.now().UTC().Truncate(time.Second), Installation: req.Installation}
	if req.OwnerName != "" {
		mark.Proxy = req.OwnerNamespace + "/" + req.OwnerName
	}
	if mark, err = p.markGuest(ctx, host, pool, req.Name, mark); err != nil {
		return providers.Instance{}, err
	}
	if err := p.build(ctx, pl, pool, base, req.Name, seed, mark); err != nil {
		return providers.Instance{}, p.undo(ctx, pl.host, req.Name, err)
	}
	return providers.Instance{ProviderID: id, Name: req.Name, State: providers.StateProvisioning, OwnerUID: req.OwnerUID, Installation: mark.Installation, CreatedAt: mark.CreatedAt}, nil
}

// build makes the guest's overlay and seed and defines and starts its
// domain; Create undoes all of it when build fails.
func (p *Provider) build(ctx context.Context, pl placement, pool libvirt.StoragePool, base cachedBase, name string, seed []byte, mark Mark) error {
	host := pl.host.Name
	diskPath, err := p.ensureOverlay(ctx, host, pool, name, uint64(pl.machine.DiskGiB)<<30, base)
	if err != nil {
		return err
	}
	seedPath, err := p.writeSeed(ctx, host, pool, name, seed)
	if err != nil {
		return err
	}
	xmlDoc, err := domainXML(domainSpec{Name: name, DomainType: p.cfg.DomainType, CPUMode: p.cfg.CPUMode, VCPUs: pl.machine.VCPUs, MemoryMiB: pl.machine.MemoryMiB,
		DiskPath: diskPath, SeedPath: seedPath, Firmware: pl.image.Firmware, Network: pl.host.Network, Bridge: pl.host.Bridge, Mark: mark})
	if err != nil {
		return err
	}
	dom, err := rpcV(ctx, p, host, "DomainDefineXMLFlags", func(a api) (libvirt.Domain, error) { return a.DomainDefineXMLFlags(xmlDoc, 0) })
	if err != nil {
		return classify("defining domain "+name, err)
	}
	return p.start(ctx, host, dom)
}

// undo tears down what a failed Create made for name and returns cause,
// with the teardown's own failure added to the message when there is one
// (cause's class stays the verdict). It runs on a context of its own,
// bounded by the RPC budget, so a Create its caller gave up on still
// cleans up behind itself.
func (p *Provider) undo(ctx context.Context, h *Host, name string, cause error) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 4*p.cfg.Budgets.RPC)
	defer cancel()
	if err := p.teardown(uctx, h, name); err != nil {
		p.cfg.Log.Info("WARNING: a failed Create could not clean up; the next Create or Delete of the guest, or the orphan GC, finishes it",
			"host", h.Name, "domain", name, "error", err.Error())
		return fmt.Errorf("%w (cleaning up after it failed too: %v)", cause, err)
	}
	return cause
}

// adopt finishes a Create whose domain already exists (an earlier attempt
// was cut off): it is started when stopped, and torn down when that start
// fails, as a domain of this Create would be.
func (p *Provider) adopt(ctx context.Context, h *Host, dom libvirt.Domain, req providers.CreateRequest) (providers.Instance, error) {
	host := h.Name
	id := FormatProviderID(host, req.Name)
	mark, ours, err := p.readMark(ctx, host, dom)
	if err != nil {
		return providers.Instance{}, err
	}
	switch {
	case !ours:
		return providers.Instance{}, fmt.Errorf("%w: domain %s exists and is not managed by proxyfleet; refusing to adopt it", providers.ErrPermanent, id)
	case mark.UID != req.OwnerUID:
		return providers.Instance{}, fmt.Errorf("%w: domain %s belongs to proxy UID %q, not %q", providers.ErrPermanent, id, mark.UID, req.OwnerUID)
	}
	st, reason, err := p.domainStateReason(ctx, host, dom)
	if err != nil {
		return providers.Instance{}, err
	}
	switch {
	case st == libvirt.DomainShutoff || st == libvirt.DomainCrashed:
		if err := p.start(ctx, host, dom); err != nil {
			return providers.Instance{}, p.undo(ctx, h, req.Name, err)
		}
	case st == libvirt.DomainPaused && libvirt.DomainPausedReason(reason) == libvirt.DomainPausedStartingUp:
		// libvirtd is still starting it (QEMU runs paused until the start
		// is done), for the earlier attempt whose caller went away: it
		// either runs or falls back to shut off; the retry sees which.
		return providers.Instance{}, fmt.Errorf("%w: domain %s is still being started (paused while starting up); an earlier Create was cut off mid-start", providers.ErrTransient, id)
	case st == libvirt.DomainPaused || st == libvirt.DomainPmsuspended:
		return providers.Instance{}, fmt.Errorf("%w: domain %s is paused; proxyfleet does not resume a domain someone paused", providers.ErrPermanent, id)
	}
	return providers.Instance{ProviderID: id, Name: req.Name, State: providers.StateProvisioning, OwnerUID: mark.UID, Installation: mark.Installation, CreatedAt: mark.CreatedAt}, nil
}

// ProviderIDFor is the providerID Create(req) would return: the host its
// placement resolves to (the image and machine type need not resolve any
// more) and the name.
func (p *Provider) ProviderIDFor(req providers.CreateRequest) (string, error) {
	if !domainName.MatchString(req.Name) {
		return "", fmt.Errorf("%w: instance name %q is not a domain name", providers.ErrPermanent, req.Name)
	}
	zone := req.Placement.Zone
	if zone == "" {
		zone = p.cfg.Defaults.Zone
	}
	if zone == "" && len(p.cfg.Hosts) == 1 {
		zone = p.cfg.Hosts[0].Name
	}
	if _, ok := p.hosts[zone]; !ok {
		return "", fmt.Errorf("%w: placement.zone %q is not a configured host", providers.ErrPermanent, zone)
	}
	return FormatProviderID(zone, req.Name), nil
}

// start starts dom and watches it for startWatch: a domain that is off or
// crashed by then is Transient (the next attempt starts it again).
func (p *Provider) start(ctx context.Context, host string, dom libvirt.Domain) error {
	err := p.call(ctx, host, "DomainCreate", p.cfg.Budgets.DomainCreate, func(a api) error { return a.DomainCreate(dom) })
	if err != nil && !isCode(err, libvirt.ErrOperationInvalid) { // already running
		err = classify("starting domain "+dom.Name, err)
		if cpuRefusal.MatchString(err.Error()) {
			return fmt.Errorf("%w; the host refused the guest CPU: %s", err, p.cpuAdvice())
		}
		return err
	}
	deadline := time.Now().Add(startWatch)
	for {
		st, err := p.domainState(ctx, host, dom)
		if err != nil {
			return err
		}
		switch st {
		case libvirt.DomainShutoff, libvirt.DomainCrashed:
			return fmt.Errorf("%w: domain %s stopped right after starting (state %d); see the host's /var/log/libvirt/qemu/%s.log (if it names the CPU or an MSR: %s)",
				providers.ErrTransient, dom.Name, st, dom.Name, p.cpuAdvice())
		}
		if time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: watching domain %s start: %v", providers.ErrTransient, dom.Name, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// cpuRefusal matches what libvirt and QEMU say when a host will not run the
// guest CPU asked for: an unknown or unsupported model, missing features,
// or (under nested virtualisation) "failed to set MSR 0x10a".
var cpuRefusal = regexp.MustCompile(`\bCPU\b|\bcpu\b|\bMSR\b|model`)

// cpuAdvice names the settings that choose another guest CPU, with the
// one in force.
func (p *Provider) cpuAdvice() string {
	mode := p.cfg.CPUMode
	if mode == "" && p.cfg.DomainType == DomainKVM {
		mode = CPUHostPassthrough
	}
	if mode == "" {
		mode = "QEMU's default"
	}
	return fmt.Sprintf("kvm.cpuMode is %s; set kvm.cpuMode to host-model or a CPU model this host runs (virsh cpu-models x86_64, e.g. qemu64), or kvm.domainType to qemu", mode)
}

// Get observes the guest. A domain that does not exist is ErrNotFound; a
// host that is not configured is Permanent (a typo in hosts must not look
// like a missing VM, which the reconciler would answer by creating one).
func (p *Provider) Get(ctx context.Context, providerID string) (providers.Instance, error) {
	host, name, err := parseProviderID(providerID)
	if err != nil {
		return providers.Instance{}, err
	}
	if _, ok := p.hosts[host]; !ok {
		return providers.Instance{}, fmt.Errorf("%w: %s names host %q, which is not configured", providers.ErrPermanent, providerID, host)
	}
	dom, exists, err := p.lookupDomain(ctx, host, name)
	if err != nil {
		return providers.Instance{}, err
	}
	if !exists {
		return providers.Instance{}, fmt.Errorf("%w: domain %s", providers.ErrNotFound, providerID)
	}
	mark, ours, err := p.readMark(ctx, host, dom)
	if err != nil {
		return providers.Instance{}, err
	}
	if !ours {
		return providers.Instance{}, fmt.Errorf("%w: domain %s is not managed by proxyfleet", providers.ErrPermanent, providerID)
	}
	st, err := p.domainState(ctx, host, dom)
	if err != nil {
		return providers.Instance{}, err
	}
	out := providers.Instance{ProviderID: providerID, Name: name, OwnerUID: mark.UID, Installation: mark.Installation, CreatedAt: mark.CreatedAt}
	ip := ""
	if st == libvirt.DomainRunning || st == libvirt.DomainBlocked {
		if ip, err = p.address(ctx, host, dom); err != nil {
			return providers.Instance{}, err
		}
	}
	out.State = stateOf(st, ip != "")
	if out.State == providers.StateRunning {
		out.IP = ip
	}
	return out, nil
}

// stateOf maps libvirt's domain state. Running without an address is still
// Provisioning (nobody can reach it yet); nostate means libvirt could not
// tell, so the next poll decides rather than a delete-and-recreate; off,
// crashed, shutting down, paused and suspended are Stopped, which the
// reconciler answers by replacing the guest.
func stateOf(st libvirt.DomainState, hasIP bool) providers.State {
	switch st {
	case libvirt.DomainRunning, libvirt.DomainBlocked:
		if hasIP {
			return providers.StateRunning
		}
		return providers.StateProvisioning
	case libvirt.DomainNostate:
		return providers.StateProvisioning
	default:
		return providers.StateStopped
	}
}

// addressSources are asked in this order: the guest agent (knows the
// guest's own view), the DHCP leases of a libvirt network, the host's ARP
// table (bridged guests).
var addressSources = []struct {
	name string
	src  libvirt.DomainInterfaceAddressesSource
}{
	{"agent", libvirt.DomainInterfaceAddressesSrcAgent},
	{"lease", libvirt.DomainInterfaceAddressesSrcLease},
	{"arp", libvirt.DomainInterfaceAddressesSrcArp},
}

// address returns the guest's first routable IPv4 address, "" when none is
// known yet. One source failing is normal while a guest boots (the agent is
// not up yet) and means "no address yet"; every source failing, or the
// connection dying under the read, is Transient — never a Running guest
// silently demoted to one without an address.
func (p *Provider) address(ctx context.Context, host string, dom libvirt.Domain) (string, error) {
	results := make([]sourceResult, 0, len(addressSources))
	for _, s := range addressSources {
		ifaces, err := rpcV(ctx, p, host, "DomainInterfaceAddresses", func(a api) ([]libvirt.DomainInterface, error) {
			return a.DomainInterfaceAddresses(dom, uint32(s.src), 0)
		})
		results = append(results, sourceResult{name: s.name, ifaces: ifaces, err: err})
		if err == nil && firstRoutableIPv4(ifaces) != "" {
			break
		}
	}
	return decideAddress(dom.Name, results)
}

// sourceResult is what one address source answered.
type sourceResult struct {
	name   string
	ifaces []libvirt.DomainInterface
	err    error
}

// decideAddress applies the address rules to the answers in source order:
// the first routable IPv4 wins; a transport failure (not a libvirt answer)
// is Transient at once; when no source has an address, some failing is "no
// address yet" and all failing is Transient.
func decideAddress(domain string, results []sourceResult) (string, error) {
	var errs []error
	for _, r := range results {
		if r.err != nil {
			if _, ok := libvirtCode(r.err); !ok {
				return "", classify("reading the addresses of domain "+domain, r.err)
			}
			errs = append(errs, fmt.Errorf("%s: %w", r.name, r.err))
			continue
		}
		if ip := firstRoutableIPv4(r.ifaces); ip != "" {
			return ip, nil
		}
	}
	if len(results) > 0 && len(errs) == len(results) {
		return "", fmt.Errorf("%w: every address source of domain %s failed: %w", providers.ErrTransient, domain, errors.Join(errs...))
	}
	return "", nil
}

// firstRoutableIPv4 skips loopback, link-local, unspecified, multicast and
// broadcast addresses: none of them reaches the guest from outside.
func firstRoutableIPv4(ifaces []libvirt.DomainInterface) string {
	for _, ifc := range ifaces {
		for _, a := range ifc.Addrs {
			ip, err := netip.ParseAddr(a.Addr)
			if err != nil || !ip.Is4() {
				continue
			}
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() ||
				ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) || ip.As4()[0] == 0 {
				continue
			}
			return ip.String()
		}
	}
	return ""
}

// Delete destroys the guest (one that is not running is fine), undefines it
// with its NVRAM, managed save and snapshot metadata, and deletes its
// overlay, seed and mark volumes by name, the mark last; everything already
// gone is success, so it also removes what a cut-off Create left without a
// domain. A host that is not configured any more is a logged no-op, so its
// Proxies can still be deleted. A domain without proxyfleet's mark is never
// touched.
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	host, name, err := parseProviderID(providerID)
	if err != nil {
		return err
	}
	h, ok := p.hosts[host]
	if !ok {
		p.cfg.Log.Info("WARNING: deleting a guest on a host that is no longer configured; nothing is done there", "providerID", providerID)
		return nil
	}
	unlock, err := p.names.Lock(ctx, host+"/"+name)
	if err != nil {
		return fmt.Errorf("%w: waiting for another operation on %s: %v", providers.ErrTransient, providerID, err)
	}
	defer unlock()
	return p.teardown(ctx, h, name)
}

// teardown is Delete under the name lock the caller holds.
func (p *Provider) teardown(ctx context.Context, h *Host, name string) error {
	host := h.Name
	dom, exists, err := p.lookupDomain(ctx, host, name)
	if err != nil {
		return err
	}
	if exists {
		if _, ours, err := p.readMark(ctx, host, dom); err != nil {
			return err
		} else if !ours {
			return fmt.Errorf("%w: domain %s is not managed by proxyfleet; refusing to delete it", providers.ErrPermanent, FormatProviderID(host, name))
		}
		err := p.rpc(ctx, host, "DomainDestroyFlags", func(a api) error { return a.DomainDestroyFlags(dom, 0) })
		if err != nil && !isCode(err, libvirt.ErrOperationInvalid, libvirt.ErrNoDomain) {
			return classify("destroying domain "+name, err)
		}
		err = p.rpc(ctx, host, "DomainUndefineFlags", func(a api) error {
			return a.DomainUndefineFlags(dom, libvirt.DomainUndefineManagedSave|libvirt.DomainUndefineSnapshotsMetadata|libvirt.DomainUndefineNvram)
		})
		if err != nil && !isCode(err, libvirt.ErrNoDomain) {
			return classify("undefining domain "+name, err)
		}
	}
	if err := p.removeVolumes(ctx, host, h.Pool, overlayVolumeName(name), seedVolumeName(name)); err != nil {
		return err
	}
	return p.removeMarks(ctx, host, h.Pool, name)
}

// ListByTag lists the guests proxyfleet made on every host, running or
// not: each domain with proxyfleet's mark, and each guest mark volume
// without a domain (a Create cut off before its define, or a Delete cut
// off after its undefine), with the overlay and seed found beside them as
// Parts. An overlay or seed without a mark, and any other volume, is not
// proxyfleet's to judge and is never listed. A domain whose metadata cannot
// be read as a mark is skipped (GC never deletes what it cannot see, and
// one broken domain must not block every other); a host that cannot be
// reached fails the whole list.
func (p *Provider) ListByTag(ctx context.Context) ([]providers.Instance, error) {
	var out []providers.Instance
	for i := range p.cfg.Hosts {
		insts, err := p.listHost(ctx, p.hosts[p.cfg.Hosts[i].Name])
		if err != nil {
			return nil, err
		}
		out = append(out, insts...)
	}
	return out, nil
}

// listHost is ListByTag on one host.
func (p *Provider) listHost(ctx context.Context, h *Host) ([]providers.Instance, error) {
	doms, err := rpcV(ctx, p, h.Name, "ConnectListAllDomains", func(a api) ([]libvirt.Domain, error) {
		doms, _, err := a.ConnectListAllDomains(1, 0)
		return doms, err
	})
	if err != nil {
		return nil, classify("listing the domains of host "+h.Name, err)
	}
	guests := map[string]*providers.Instance{}
	for _, d := range doms {
		mark, ours, err := p.readMark(ctx, h.Name, d)
		if err != nil {
			if !isLibvirtAnswer(err) && !errors.Is(err, providers.ErrPermanent) {
				return nil, err // the connection, not the domain
			}
			p.cfg.Log.Info("skipping a domain whose metadata cannot be read", "host", h.Name, "domain", d.Name, "error", err.Error())
			continue
		}
		if !ours {
			continue
		}
		guests[d.Name] = &providers.Instance{ProviderID: FormatProviderID(h.Name, d.Name), Name: d.Name, OwnerUID: mark.UID, Installation: mark.Installation, CreatedAt: mark.CreatedAt,
			Parts: []string{providers.PartDomain}}
	}
	vols, err := p.listVolumes(ctx, h)
	if err != nil {
		return nil, err
	}
	marked := map[string]bool{}
	for vname := range vols {
		guest, mark, ok := parseMarkVolume(vname)
		if !ok {
			continue
		}
		marked[guest] = true
		if guests[guest] == nil {
			guests[guest] = &providers.Instance{ProviderID: FormatProviderID(h.Name, guest), Name: guest, OwnerUID: mark.UID, Installation: mark.Installation, CreatedAt: mark.CreatedAt}
		}
	}
	out := make([]providers.Instance, 0, len(guests))
	for _, name := range slices.Sorted(maps.Keys(guests)) {
		g := guests[name]
		for _, part := range []struct{ kind, vol string }{{providers.PartOverlay, overlayVolumeName(name)}, {providers.PartSeed, seedVolumeName(name)}} {
			if _, ok := vols[part.vol]; ok {
				g.Parts = append(g.Parts, part.kind)
			}
		}
		if marked[name] {
			g.Parts = append(g.Parts, providers.PartMark)
		}
		out = append(out, *g)
	}
	return out, nil
}

// isLibvirtAnswer reports whether err came from the daemon rather than the
// transport.
func isLibvirtAnswer(err error) bool {
	_, ok := libvirtCode(err)
	return ok
}
