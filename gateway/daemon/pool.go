package daemon

import (
	"context"
	"fmt"
	"log/slog"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/lastknown"
)

// localPool loads the members of a gateway that holds its own pool (the
// upstreams file, the static members, or direct egress) into store, and
// builds the file source (calling reload on a change) and the prober when
// configured; neither runs yet.
func localPool(cfg *Config, store pool.LeaseStore, reload func([]pool.Member), rec *metrics.Metrics, log *slog.Logger) (
	[]pool.Member, *pool.FileSource, *pool.Prober, error) {
	var (
		members    []pool.Member
		fileSource *pool.FileSource
		err        error
	)
	switch {
	case cfg.UpstreamsFile != "":
		fileSource = pool.NewFileSource(cfg.UpstreamsFile, pool.FileSourceOptions{
			Static:   cfg.Static,
			Interval: cfg.ReloadInterval,
			OnChange: func(next []pool.Member) {
				next, err := cfg.Tiers.Members(next)
				if err != nil {
					log.Error("upstreams file rejected; keeping the current members", "err", err)
					return
				}
				reload(next)
			},
			OnError: func(err error) {
				log.Error("upstreams file rejected; keeping the current members", "err", err)
			},
		})
		if members, err = fileSource.Load(); err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", or(cfg.Names.UpstreamsFile, "UpstreamsFile"), err)
		}
		if len(members) == 0 {
			log.Warn("no members: every request gets 503 until the upstreams file lists one", "file", cfg.UpstreamsFile)
		}
	case len(cfg.Static) > 0:
		if members, err = pool.MergeMembers(cfg.Static, nil); err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", or(cfg.Names.Static, "Static"), err)
		}
	default:
		// Nothing configured: the gateway works on a fresh machine. A
		// configured but empty upstreams file never falls back to this, so a
		// crawler meant to go through proxies never leaves from this host.
		members = []pool.Member{pool.DirectMember()}
	}
	if members, err = cfg.Tiers.Members(members); err != nil {
		from := or(cfg.Names.Static, "Static")
		if cfg.UpstreamsFile != "" {
			from = or(cfg.Names.UpstreamsFile, "UpstreamsFile")
		}
		return nil, nil, nil, fmt.Errorf("%s: %w", from, err)
	}
	store.SetMembers(members)

	p := cfg.Probe
	if p == nil {
		return members, fileSource, nil, nil
	}
	prober, err := pool.NewProber(func() []pool.Member { return memberList(store.Members()) }, store, pool.ProberOptions{
		URL:              p.URL,
		Interval:         p.Interval,
		Timeout:          p.Timeout,
		SuccessThreshold: p.SuccessThreshold,
		FailureThreshold: p.FailureThreshold,
		Recorder:         rec,
		Logger:           log,
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", or(cfg.Names.Probe, "Probe"), err)
	}
	return members, fileSource, prober, nil
}

// storeRemote is a shared lease store (Redis) as the last-known pool's
// remote: a gateway rides out its store as a --lease-api gateway rides out
// the controller, with the same pool.
type storeRemote struct{ pool.LeaseStore }

// Members is the store's member list, credentials included.
func (s storeRemote) Members(ctx context.Context) ([]pool.MemberStatus, error) {
	return s.ListMembers(ctx)
}

// storeRemoteLater is a storeRemote whose store releases later
// (pool.LaterReleaser), as the Redis store does.
type storeRemoteLater struct {
	storeRemote
	later pool.LaterReleaser
}

func (s storeRemoteLater) ReleaseLater(id string) { s.later.ReleaseLater(id) }

// rideOutStore wraps a shared lease store in the last-known pool: while the
// store does not answer (Redis restarting, loading its AOF, failing over)
// the gateway leases from the members, cooldowns and health it last read,
// and tells the store what it learnt when it is back.
func rideOutStore(cfg *Config, store pool.LeaseStore, reg prometheus.Registerer, log *slog.Logger) (*lastknown.Pool, error) {
	var remote lastknown.Remote = storeRemote{store}
	if lr, ok := store.(pool.LaterReleaser); ok {
		remote = storeRemoteLater{storeRemote{store}, lr}
	}
	return newLastKnown(cfg, remote, reg, log.With("pool", "lease store"))
}

// newLastKnown wraps the lease API client (or a shared store) in the
// last-known pool that rides out its outages, with its outage metrics.
func newLastKnown(cfg *Config, remote lastknown.Remote, reg prometheus.Registerer, log *slog.Logger) (*lastknown.Pool, error) {
	var lk *lastknown.Pool
	rec := metrics.NewPoolOutages(reg, func() (bool, bool) {
		st := lk.Status()
		return st.Down, st.Refusing
	})
	lk, err := lastknown.New(lastknown.Options{
		Remote:   remote,
		Grace:    cfg.OutageGrace,
		Refresh:  cfg.PoolRefresh,
		Store:    cfg.Store,
		Recorder: rec,
		Logger:   log,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", or(cfg.Names.OutageGrace, "OutageGrace"), err)
	}
	return lk, nil
}

// memberList strips the status from a member listing.
func memberList(st []pool.MemberStatus) []pool.Member {
	out := make([]pool.Member, len(st))
	for i, m := range st {
		out[i] = m.Member
	}
	return out
}
