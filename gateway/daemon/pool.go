package daemon

import (
	"fmt"
	"log/slog"

	prometheus "github.com/proxyfleet/proxyfleet/internal/prom"
	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/lastknown"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
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
			OnChange: reload,
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

// newLastKnown wraps the lease API client in the last-known pool that rides
// out its outages, with its outage metrics.
func newLastKnown(cfg *Config, remote *leaseapi.Client, reg prometheus.Registerer, log *slog.Logger) (*lastknown.Pool, error) {
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
		Logger:   log.With("poolAPI", cfg.PoolAPI),
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
