// Package gc is the orphan garbage collector: the crash-safety net for the
// one gap the Proxy reconciler cannot close alone, a crash after a provider
// Create but before the status write that records the instance. Every
// interval it lists each provider's managed instances and deletes those whose
// owning Proxy no longer exists.
//
// Deleting is destructive, so the GC trusts only provable orphans: an instance
// without the owner-UID label is never deleted, a young instance may still be
// mid-create, a Proxy with a deletionTimestamp still counts as live (its
// finalizer owns that deletion), and a failed Proxy list skips the sweep.
//
// It imports api/v1alpha1 and providers only; never the reconcilers or a
// provider implementation.
package gc

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/providers"
)

const (
	// DefaultInterval is the time between sweeps (and before the first one).
	DefaultInterval = 10 * time.Minute
	// DefaultMinAge is how old an instance must be before the GC may delete
	// it: comfortably longer than a Create plus the status write after it.
	DefaultMinAge = 10 * time.Minute
)

// ErrNamespaced is returned by New when the Proxy view is restricted to one
// namespace and AllowNamespaced is not set: Proxies elsewhere would be
// invisible, so their live instances would look orphaned.
var ErrNamespaced = errors.New("orphan GC refuses to run on a namespace-restricted Proxy view: " +
	"instances of Proxies in other namespaces would look orphaned and be deleted; " +
	"set --gc-allow-namespaced only when this controller is the sole user of its providers")

// Options configure New.
type Options struct {
	// Reader lists Proxies, usually the manager's cache (mgr.GetClient()).
	// Required.
	Reader client.Reader
	// Providers are the configured providers by entry name (decorated ones
	// are fine: sweeps are provider requests and count as such).
	Providers map[string]providers.Provider
	// Interval is the time between sweeps; the first sweep runs a full
	// interval after Start. Zero means DefaultInterval.
	Interval time.Duration
	// MinAge is the age below which an instance is never deleted. Zero means
	// DefaultMinAge.
	MinAge time.Duration
	// Namespace is the namespace the Reader is restricted to ("" = the whole
	// cluster). With a Namespace, New refuses unless AllowNamespaced is set.
	Namespace string
	// AllowNamespaced accepts a namespace-restricted view: the operator
	// asserts that no Proxy outside Namespace uses these providers.
	AllowNamespaced bool
	// Installation is this controller's installation ID, the one its
	// reconciler stamps on every instance it creates: only instances with
	// it are ever deleted. Required.
	Installation string
	// Clock is the time source of ticks and ages; nil means the real clock.
	Clock clock.WithTicker
	// Logger receives sweep failures and one WARNING line per deletion.
	Logger logr.Logger
	// Recorder, when set, counts every orphan the sweep removed, once per
	// part of it (a kvm guest's domain, overlay, seed and mark; a VM; a
	// Pod).
	Recorder Recorder
}

// Recorder counts removed orphans; the metrics package implements it as
// proxyfleet_gc_orphans_deleted_total{provider,kind}.
type Recorder interface {
	OrphanDeleted(provider, kind string)
}

// KindInstance is the kind counted for an instance whose provider names
// no parts.
const KindInstance = "instance"

// Sweeper deletes provider instances whose Proxy no longer exists. It is a
// leader-elected manager.Runnable: deleting is destructive, so exactly one
// replica sweeps. Build it with New, then add it to the manager.
type Sweeper struct {
	o Options
}

var (
	_ manager.Runnable               = (*Sweeper)(nil)
	_ manager.LeaderElectionRunnable = (*Sweeper)(nil)
)

// New checks o and fills its defaults. It returns ErrNamespaced when the
// view is namespace-restricted without AllowNamespaced, and an error naming
// the option for an unusable configuration, so nothing is added to a
// manager that would stop it at start.
func New(o Options) (*Sweeper, error) {
	if o.Reader == nil {
		return nil, errors.New("orphan GC: Options.Reader (the Proxy reader) is required")
	}
	if o.Namespace != "" && !o.AllowNamespaced {
		return nil, fmt.Errorf("%w (the Proxy view is restricted to namespace %q)", ErrNamespaced, o.Namespace)
	}
	if o.Installation == "" {
		return nil, errors.New("orphan GC: Options.Installation (this installation's ID on its instances) is required")
	}
	if o.Interval < 0 || o.MinAge < 0 {
		return nil, fmt.Errorf("orphan GC: Options.Interval (%s) and Options.MinAge (%s) must not be negative", o.Interval, o.MinAge)
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.MinAge == 0 {
		o.MinAge = DefaultMinAge
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	return &Sweeper{o: o}, nil
}

// NeedLeaderElection is true: only the leader may delete instances.
func (s *Sweeper) NeedLeaderElection() bool { return true }

// Start sweeps every Interval until ctx ends.
func (s *Sweeper) Start(ctx context.Context) error {
	if s.o.Namespace != "" {
		s.o.Logger.Info("WARNING: orphan GC runs on a namespace-restricted Proxy view; instances of Proxies in other namespaces will be deleted",
			"namespace", s.o.Namespace)
	}
	s.o.Logger.Info("orphan GC started", "interval", s.o.Interval, "minAge", s.o.MinAge, "providers", len(s.o.Providers))
	ticker := s.o.Clock.NewTicker(s.o.Interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
			s.sweep(ctx)
		}
	}
}

// sweepResult summarises one sweep, for the log line and for tests.
type sweepResult struct {
	// skipped is true when the Proxy list failed and nothing was examined.
	skipped bool
	// deleted are the instances the sweep deleted, by provider.
	deleted map[string][]providers.Instance
	// kept counts the instances left alone, by decision.
	kept map[decision]int
	// errors counts failed ListByTag and Delete calls.
	errors int
}

// sweep is one pass: the live UID set, then every provider's instances
// judged by decide. A failed Proxy list skips the whole pass (never guess);
// a failing provider is logged and the next one is swept.
//
// A sweep is one span, gc.sweep; the provider calls are its children.
func (s *Sweeper) sweep(ctx context.Context) sweepResult {
	ctx, span := otel.Tracer("github.com/proxyfleet/proxyfleet/controller/gc").Start(ctx, "gc.sweep")
	defer span.End()
	res := sweepResult{deleted: map[string][]providers.Instance{}, kept: map[decision]int{}}
	live, err := s.liveUIDs(ctx)
	if err != nil {
		s.o.Logger.Error(err, "orphan GC: skipping this sweep, the Proxy list failed (deleting on a guess could kill live instances)")
		res.skipped = true
		return res
	}
	now := s.o.Clock.Now()
	minAge := s.o.MinAge
	names := make([]string, 0, len(s.o.Providers))
	for name := range s.o.Providers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if ctx.Err() != nil {
			return res
		}
		insts, err := s.o.Providers[name].ListByTag(ctx)
		if err != nil {
			res.errors++
			s.o.Logger.Error(err, "orphan GC: listing the provider's instances failed; continuing with the next provider", "provider", name)
			continue
		}
		for _, inst := range insts {
			d := decide(inst, live, s.o.Installation, now, minAge)
			if d != deleteOrphan {
				res.kept[d]++
				continue
			}
			s.o.Logger.Info("WARNING: orphan GC deleting an instance whose Proxy no longer exists",
				"provider", name, "providerID", inst.ProviderID, "uid", inst.OwnerUID, "parts", partsOf(inst),
				"instance", inst.Name, "age", now.Sub(inst.CreatedAt).Round(time.Second).String())
			if err := s.o.Providers[name].Delete(ctx, inst.ProviderID); err != nil {
				res.errors++
				s.o.Logger.Error(err, "orphan GC: deleting the orphaned instance failed; the next sweep retries",
					"provider", name, "providerID", inst.ProviderID, "uid", inst.OwnerUID)
				continue
			}
			res.deleted[name] = append(res.deleted[name], inst)
			s.record(name, inst)
		}
	}
	s.o.Logger.V(1).Info("orphan GC sweep finished", "deleted", countAll(res.deleted), "kept", res.kept, "errors", res.errors)
	return res
}

// liveUIDs lists every Proxy visible to the Reader. Proxies being deleted
// are included: their finalizer owns the instance's deletion.
func (s *Sweeper) liveUIDs(ctx context.Context) (map[string]struct{}, error) {
	var list v1alpha1.ProxyList
	var opts []client.ListOption
	if s.o.Namespace != "" {
		opts = append(opts, client.InNamespace(s.o.Namespace))
	}
	if err := s.o.Reader.List(ctx, &list, opts...); err != nil {
		return nil, err
	}
	live := make(map[string]struct{}, len(list.Items))
	for i := range list.Items {
		live[string(list.Items[i].UID)] = struct{}{}
	}
	return live, nil
}

func countAll(m map[string][]providers.Instance) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

// partsOf is what the instance consists of, for the log and the metric.
func partsOf(inst providers.Instance) []string {
	if len(inst.Parts) == 0 {
		return []string{KindInstance}
	}
	return inst.Parts
}

// record counts one removed orphan per part.
func (s *Sweeper) record(provider string, inst providers.Instance) {
	if s.o.Recorder == nil {
		return
	}
	for _, kind := range partsOf(inst) {
		s.o.Recorder.OrphanDeleted(provider, kind)
	}
}
