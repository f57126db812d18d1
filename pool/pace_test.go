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
