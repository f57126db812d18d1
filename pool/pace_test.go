package pool

import (
	"context"
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
