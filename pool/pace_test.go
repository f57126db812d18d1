package pool

import (
	"context"
	"strconv"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/proxyfleet/proxyfleet/rotation"
)

func TestPacesLearntPaceDecaysAfterTheQuietPeriodAndPlacesExpire(t *testing.T) {
	ctx := context.Background()
	clk := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	p := NewPaces(clk)
	l, _ := p.SiteAnswered(ctx, SiteAnswer{Site: "s", Member: "m", Result: rotation.ResultBanned})
	if !l.Slowed() {
		t.Fatal("a ban did not slow the site")
	}
	clk.Step(rotation.PaceQuiet - time.Second)
	if got, _ := p.SlowedSites(ctx); len(got) != 1 {
		t.Fatalf("slowed %v before the quiet period ended", got)
	}
	clk.Step(time.Second)
	if got, _ := p.SlowedSites(ctx); len(got) != 0 {
		t.Fatalf("slowed %v after the quiet period", got)
	}
	if s, _ := p.ReserveSlot(ctx, SlotRequest{Site: "s", Member: "m", Auto: true}); s.Interval != 0 {
		t.Fatalf("slot %+v after the decay, want no pace", s)
	}
	// A holder that never leaves stops counting after PaceHold.
	if in, _ := p.EnterSite(ctx, "s", "gone", 1); !in {
		t.Fatal("enter")
	}
	if in, _ := p.EnterSite(ctx, "s", "next", 1); in {
		t.Fatal("a second place at limit 1")
	}
	clk.Step(PaceHold)
	if in, _ := p.EnterSite(ctx, "s", "next", 1); !in {
		t.Fatal("the crashed holder's place never came back")
	}
}

// BenchmarkPacesDecision is one pace decision with limits on the memory
// store: a slot at a 1µs interval over 100 members of one site, a place in
// flight taken and given back, an answer fed to a slowed site.
//
//	go test -run x -bench BenchmarkPacesDecision ./pool/
func BenchmarkPacesDecision(b *testing.B) {
	ctx := context.Background()
	members := make([]string, 100)
	for i := range members {
		members[i] = "m" + strconv.Itoa(i)
	}
	b.Run("reserve", func(b *testing.B) {
		p := NewPaces(nil)
		i := 0
		for b.Loop() {
			if _, err := p.ReserveSlot(ctx, SlotRequest{Site: "example.com", Member: members[i%len(members)], MinInterval: time.Microsecond, Auto: true, MaxWait: time.Hour}); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("enter+leave", func(b *testing.B) {
		p := NewPaces(nil)
		for b.Loop() {
			if in, _ := p.EnterSite(ctx, "example.com", "h", 4); !in {
				b.Fatal("no place")
			}
			_ = p.LeaveSite(ctx, "example.com", "h")
		}
	})
	b.Run("answer", func(b *testing.B) {
		p := NewPaces(nil)
		_, _ = p.SiteAnswered(ctx, SiteAnswer{Site: "example.com", Member: "m0", Result: rotation.ResultBanned})
		for b.Loop() {
			l, err := p.SiteAnswered(ctx, SiteAnswer{Site: "example.com", Member: "m1", Result: rotation.ResultOK, SeenCuts: 1})
			if err != nil {
				b.Fatal(err)
			}
			if !l.Slowed() { // back to unlimited (every ~5000 answers): cut it again
				_, _ = p.SiteAnswered(ctx, SiteAnswer{Site: "example.com", Member: "m0", Result: rotation.ResultBanned})
			}
		}
	})
}

func TestPacesPastMaxPaceSitesSweepsOncePerDoublingNotPerNewSite(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		busy func(p *Paces, site string)
	}{
		{"places in flight", func(p *Paces, site string) { _, _ = p.EnterSite(ctx, site, "h", 1) }},
		{"slots ahead", func(p *Paces, site string) {
			for range 2 {
				_, _ = p.ReserveSlot(ctx, SlotRequest{Site: site, Member: "m", MinInterval: time.Hour, MaxWait: 2 * time.Hour})
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPaces(testingclock.NewFakeClock(time.Unix(1_700_000_000, 0)))
			const n = 3 * maxPaceSites
			for i := range n {
				tc.busy(p, "s"+strconv.Itoa(i)+".example")
			}
			if len(p.sites) != n {
				t.Fatalf("%d sites kept, want all %d (every one busy)", len(p.sites), n)
			}
			// Every site is busy, so no sweep frees one: sweeping at every
			// new site past the bound is quadratic, under the mutex every
			// decision of every site takes.
			if p.sweeps > 2 {
				t.Fatalf("%d sweeps for %d busy sites, want one per doubling past %d", p.sweeps, n, maxPaceSites)
			}
		})
	}
}

func TestPacesForgetsIdleSitesPastMaxPaceSites(t *testing.T) {
	ctx := context.Background()
	clk := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	p := NewPaces(clk)
	for i := range 3 * maxPaceSites {
		_, _ = p.SiteAnswered(ctx, SiteAnswer{Site: "s" + strconv.Itoa(i) + ".example", Member: "m", Result: rotation.ResultBanned})
	}
	clk.Step(rotation.PaceQuiet)
	for i := range 3 * maxPaceSites {
		_, _ = p.EnterSite(ctx, "t"+strconv.Itoa(i)+".example", "h", 1)
		_ = p.LeaveSite(ctx, "t"+strconv.Itoa(i)+".example", "h")
	}
	if len(p.sites) > 2*maxPaceSites {
		t.Fatalf("%d sites kept, want at most %d once the learnt paces decayed", len(p.sites), 2*maxPaceSites)
	}
}

// TestPacesRemembersAtMostMaxPaceSitesTheMostCutFirst: learnt paces are
// remembered for hours (rotation.PaceRule.Memory), so they are bounded:
// past maxPaceSites the idle ones that matter least (fewest cuts, oldest)
// are forgotten, and a site cut twice outlives thousands cut once.
func TestPacesRemembersAtMostMaxPaceSitesTheMostCutFirst(t *testing.T) {
	ctx := context.Background()
	clk := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	p := NewPaces(clk)
	mem := rotation.Cut{Interval: time.Second, Memory: 24 * time.Hour}
	ban := func(site, member string) {
		_, _ = p.SiteAnswered(ctx, SiteAnswer{Site: site, Member: member, Result: rotation.ResultBanned, SeenCuts: 1, FirstCut: mem})
	}
	ban("twice.example", "m1")
	clk.Step(time.Second)
	ban("twice.example", "m2")
	for i := range 3 * maxPaceSites {
		ban("s"+strconv.Itoa(i)+".example", "m")
	}
	if len(p.sites) > maxPaceSites {
		t.Fatalf("%d sites remembered, want at most %d", len(p.sites), maxPaceSites)
	}
	if p.sweeps > 6 {
		t.Fatalf("%d sweeps for %d sites, want a few", p.sweeps, 3*maxPaceSites)
	}
	if l := p.sites["twice.example"]; l == nil || l.learnt.Cuts != 2 {
		t.Fatalf("the site cut twice was forgotten before sites cut once")
	}
	// Remembered past the quiet period, faded, not forgotten.
	clk.Step(rotation.PaceQuiet)
	s, _ := p.ReserveSlot(ctx, SlotRequest{Site: "twice.example", Member: "m3", Auto: true, MaxWait: time.Hour})
	if s.Interval != time.Second || s.Learnt.Faded != 1 {
		t.Fatalf("slot %+v after the quiet period, want the 2s cut faded once to 1s", s)
	}
}
