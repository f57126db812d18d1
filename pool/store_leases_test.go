package pool

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// An ID names its slot and its nonce: one that was not handed out, or
// whose slot now holds another lease, is unknown, never that other lease.
func TestStoreLeaseIDOfAReusedSlotIsUnknown(t *testing.T) {
	s, _ := newTestStore(t, StoreOptions{ReleasedRetained: -1}, "a")
	ctx := context.Background()
	old := mustAcquire(t, s, AcquireRequest{Target: "t"})
	_ = s.Release(ctx, old.ID) // nothing retained: forgotten at once
	l := mustAcquire(t, s, AcquireRequest{Target: "t"})
	_, oldSlot, _ := parseLeaseID(old.ID)
	if _, slot, ok := parseLeaseID(l.ID); !ok || slot != oldSlot || l.ID == old.ID {
		t.Fatalf("IDs %s and %s: the second lease did not reuse the freed slot with a nonce of its own", old.ID, l.ID)
	}
	if err := s.Report(ctx, old.ID, Report{Result: rotation.ResultBanned}); !errors.Is(err, ErrUnknownLease) {
		t.Errorf("report on the forgotten lease = %v, want ErrUnknownLease", err)
	}
	_ = s.Release(ctx, old.ID)
	if n := s.ActiveLeases(); n != 1 {
		t.Errorf("releasing the forgotten lease left %d active, want 1 (the slot's new lease)", n)
	}
	if st := s.Members()[0]; st.Cooldowns != nil {
		t.Errorf("the forgotten lease's report cooled its slot's new member: %v", st.Cooldowns)
	}

	bad := []string{
		"", "nope", strings.ToLower(l.ID), l.ID + "A", l.ID[:leaseIDLen-1],
		l.ID[:10] + "\n" + l.ID[11:],
		leaseID([2]uint64{1, 2}, 0),  // a slot in use, another nonce
		leaseID([2]uint64{1, 2}, 99), // a slot never handed out
	}
	for _, id := range bad {
		if err := s.Report(ctx, id, Report{Result: rotation.ResultOK}); !errors.Is(err, ErrUnknownLease) {
			t.Errorf("report on %q = %v, want ErrUnknownLease", id, err)
		}
	}
	mustReport(t, s, l.ID, Report{Result: rotation.ResultOK})
}

// A burst of leases leaves neither slab chunks, heap array nor interned
// targets behind once the leases are forgotten.
func TestStoreGivesLeaseMemoryBackAfterABurst(t *testing.T) {
	pol := rotation.CooldownPolicy{Default: time.Minute, Max: 10 * time.Minute}
	s, clk := newTestStore(t, StoreOptions{Cooldown: pol}, "a", "b")
	const n = 5000
	burst := func() {
		for i := range n / 2 {
			mustAcquire(t, s, AcquireRequest{Target: "site" + strconv.Itoa(i%500), TTL: time.Minute})
		}
	}
	burst()
	keep := mustAcquire(t, s, AcquireRequest{Target: "kept", TTL: time.Hour})
	burst()
	if got := len(s.targets.index); got != 501 {
		t.Fatalf("%d targets interned for 501 distinct ones", got)
	}
	if got := len(s.slab.chunks); got < n/leaseChunk {
		t.Fatalf("%d chunks for %d leases", got, n+1)
	}
	clk.Step(12 * time.Minute) // the burst ended 11 minutes ago, past its report window
	s.sweep()
	if got := s.leaseCount(); got != 1 {
		t.Fatalf("%d leases held after the sweep, want 1", got)
	}
	if got := len(s.targets.index); got != 1 {
		t.Errorf("%d targets interned after the sweep, want 1", got)
	}
	// The kept lease sits past the first chunk: its chunk stays, the
	// later ones go, and new leases fill the slots below it first.
	if got, want := len(s.slab.chunks), n/2/leaseChunk+1; got != want {
		t.Errorf("%d chunks after the sweep, want %d (up to the kept lease's)", got, want)
	}
	if cap(s.live.slots) > 64 {
		t.Errorf("expiry heap keeps an array of %d for 1 lease", cap(s.live.slots))
	}
	next := mustAcquire(t, s, AcquireRequest{Target: "t"})
	if _, e := s.lookup(next.ID); e != s.slab.at(0) {
		t.Errorf("a new lease after the sweep took %s, not the lowest free slot", next.ID)
	}
	_ = s.Release(context.Background(), keep.ID)
	_ = s.Release(context.Background(), next.ID)
	clk.Step(11 * time.Minute)
	s.sweep()
	if got := len(s.slab.chunks); got != 1 || s.leaseCount() != 0 {
		t.Errorf("%d chunks and %d leases after every lease was forgotten, want 1 and 0", got, s.leaseCount())
	}
	if got := len(s.targets.index); got != 0 {
		t.Errorf("%d targets interned with no lease left", got)
	}
	mustReport(t, s, mustAcquire(t, s, AcquireRequest{Target: "again"}).ID, Report{Result: rotation.ResultOK})
}

// A lease's target falls back from the report to the lease: the interned
// target is the one the acquire named, whichever lease interned it first.
func TestStoreReportFallsBackToTheInternedTarget(t *testing.T) {
	s, _ := newTestStore(t, StoreOptions{ReleasedRetained: -1}, "a", "b")
	ctx := context.Background()
	first := mustAcquire(t, s, AcquireRequest{Target: "x.example"})
	second := mustAcquire(t, s, AcquireRequest{Target: "x.example"})
	_ = s.Release(ctx, first.ID) // forgotten at once: the target has one lease left
	mustReport(t, s, second.ID, Report{Result: rotation.ResultBanned})
	cds, _ := s.ListCooldowns(ctx)
	if len(cds) != 1 || cds[0].Target != "x.example" || cds[0].Member != second.Member.Name {
		t.Errorf("cooldowns = %+v, want %s for x.example", cds, second.Member.Name)
	}
}

// The entry's size is the store's cost per lease, paid for the report
// window after the lease ends too (docs/performance.md).
func TestLeaseEntryStaysSmall(t *testing.T) {
	if got := unsafe.Sizeof(leaseEntry{}); got > 40 {
		t.Errorf("leaseEntry is %d bytes, want at most 40", got)
	}
	if got := addSat(math.MaxInt64-1, time.Hour); got != math.MaxInt64 {
		t.Errorf("addSat past the end = %d, want MaxInt64", got)
	}
	if got := addSat(math.MinInt64+1, -time.Hour); got != math.MinInt64 {
		t.Errorf("addSat before the start = %d, want MinInt64", got)
	}
}
