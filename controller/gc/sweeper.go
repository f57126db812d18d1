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

// ErrNamespaced is returned by Start when the Proxy view is restricted to one
// namespace and AllowNamespaced is not set: Proxies elsewhere would be
// invisible, so their live instances would look orphaned.
var ErrNamespaced = errors.New("orphan GC refuses to run on a namespace-restricted Proxy view: " +
	"instances of Proxies in other namespaces would look orphaned and be deleted; " +
	"set --gc-allow-namespaced only when this controller is the sole user of its providers")

// Sweeper deletes provider instances whose Proxy no longer exists. It is a
// leader-elected manager.Runnable: deleting is destructive, so exactly one
// replica sweeps. Configure the fields, then add it to the manager.
type Sweeper struct {
	// Reader lists Proxies, usually the manager's cache (mgr.GetClient()).
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
	// cluster). With a Namespace, Start refuses to run unless
	// AllowNamespaced is set.
	Namespace string
	// AllowNamespaced accepts a namespace-restricted view: the operator
	// asserts that no Proxy outside Namespace uses these providers.
	AllowNamespaced bool
	// Clock is the time source; nil means the real clock.
	Clock clock.WithTicker
	// Logger receives sweep failures and one WARNING line per deletion.
	Logger logr.Logger
}

var (
	_ manager.Runnable               = (*Sweeper)(nil)
	_ manager.LeaderElectionRunnable = (*Sweeper)(nil)
)

// NeedLeaderElection is true: only the leader may delete instances.
func (s *Sweeper) NeedLeaderElection() bool { return true }

// Start sweeps every Interval until ctx ends. It returns ErrNamespaced at
// once, stopping the manager, when the view is namespace-restricted without
// AllowNamespaced, and an error for an unusable configuration.
func (s *Sweeper) Start(ctx context.Context) error {
	if s.Reader == nil {
		return errors.New("orphan GC: a Proxy reader is required")
	}
	if s.Namespace != "" && !s.AllowNamespaced {
		return fmt.Errorf("%w (the Proxy view is restricted to namespace %q)", ErrNamespaced, s.Namespace)
	}
	interval, minAge := s.interval(), s.minAge()
	if interval < 0 || minAge < 0 {
		return fmt.Errorf("orphan GC: interval (%s) and minimum age (%s) must not be negative", interval, minAge)
	}
	if s.Namespace != "" {
		s.Logger.Info("WARNING: orphan GC runs on a namespace-restricted Proxy view; instances of Proxies in other namespaces will be deleted",
			"namespace", s.Namespace)
	}
	s.Logger.Info("orphan GC started", "interval", interval, "minAge", minAge, "providers", len(s.Providers))
	ticker := s.clock().NewTicker(interval)
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
	kept map[Decision]int
	// errors counts failed ListByTag and Delete calls.
	errors int
}

// sweep is one pass: the live UID set, then every provider's instances
// judged by Decide. A failed Proxy list skips the whole pass (never guess);
// a failing provider is logged and the next one is swept.
//
// A sweep is one span, gc.sweep; the provider calls are its children.
func (s *Sweeper) sweep(ctx context.Context) sweepResult {
	ctx, span := otel.Tracer("github.com/proxyfleet/proxyfleet/controller/gc").Start(ctx, "gc.sweep")
	defer span.End()
	res := sweepResult{deleted: map[string][]providers.Instance{}, kept: map[Decision]int{}}
	live, err := s.liveUIDs(ctx)
	if err != nil {
		s.Logger.Error(err, "orphan GC: skipping this sweep, the Proxy list failed (deleting on a guess could kill live instances)")
		res.skipped = true
		return res
	}
	now := s.clock().Now()
	minAge := s.minAge()
	names := make([]string, 0, len(s.Providers))
	for name := range s.Providers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if ctx.Err() != nil {
			return res
		}
		insts, err := s.Providers[name].ListByTag(ctx)
		if err != nil {
			res.errors++
			s.Logger.Error(err, "orphan GC: listing the provider's instances failed; continuing with the next provider", "provider", name)
			continue
		}
		for _, inst := range insts {
			d := Decide(inst, live, now, minAge)
			if d != Delete {
				res.kept[d]++
				continue
			}
			s.Logger.Info("WARNING: orphan GC deleting an instance whose Proxy no longer exists",
				"provider", name, "providerID", inst.ProviderID, "uid", inst.OwnerUID,
				"instance", inst.Name, "age", now.Sub(inst.CreatedAt).Round(time.Second).String())
			if err := s.Providers[name].Delete(ctx, inst.ProviderID); err != nil {
				res.errors++
				s.Logger.Error(err, "orphan GC: deleting the orphaned instance failed; the next sweep retries",
					"provider", name, "providerID", inst.ProviderID, "uid", inst.OwnerUID)
				continue
			}
			res.deleted[name] = append(res.deleted[name], inst)
		}
	}
	s.Logger.V(1).Info("orphan GC sweep finished", "deleted", countAll(res.deleted), "kept", res.kept, "errors", res.errors)
	return res
}

// liveUIDs lists every Proxy visible to the Reader. Proxies being deleted
// are included: their finalizer owns the instance's deletion.
func (s *Sweeper) liveUIDs(ctx context.Context) (map[string]struct{}, error) {
	var list v1alpha1.ProxyList
	var opts []client.ListOption
	if s.Namespace != "" {
		opts = append(opts, client.InNamespace(s.Namespace))
	}
	if err := s.Reader.List(ctx, &list, opts...); err != nil {
		return nil, err
	}
	live := make(map[string]struct{}, len(list.Items))
	for i := range list.Items {
		live[string(list.Items[i].UID)] = struct{}{}
	}
	return live, nil
}

func (s *Sweeper) interval() time.Duration {
	if s.Interval == 0 {
		return DefaultInterval
	}
	return s.Interval
}

func (s *Sweeper) minAge() time.Duration {
	if s.MinAge == 0 {
		return DefaultMinAge
	}
	return s.MinAge
}

func (s *Sweeper) clock() clock.WithTicker {
	if s.Clock == nil {
		return clock.RealClock{}
	}
	return s.Clock
}

func countAll(m map[string][]providers.Instance) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}
