package statuspage

import (
	"fmt"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func series(c Chart) map[string][]int64 {
	out := map[string][]int64{}
	for _, s := range c.Series {
		out[s.Outcome] = s.Counts
	}
	return out
}

func TestTimelineCountsOutcomesPerBucketAndForgetsPastTheWindow(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_700_000_000, 0))
	tl := NewTimeline(TimelineOptions{Window: 3 * time.Minute, Bucket: time.Minute, Clock: clk})
	tl.Add("ok")
	tl.Add("ok")
	tl.Add("banned")
	clk.SetTime(clk.Now().Add(time.Minute))
	tl.Add("ok")
	c := tl.Chart()
	if c.Bars != 3 || c.BucketSeconds != 60 || c.Total != 4 {
		t.Fatalf("chart %+v, want 3 bars of 60s with 4 counted", c)
	}
	if got := fmt.Sprint(series(c)); got != "map[banned:[0 1 0] ok:[0 2 1]]" {
		t.Fatalf("series %s", got)
	}
	if c.Series[0].Outcome != "ok" {
		t.Fatalf("ok is not the first series: %+v", c.Series)
	}
	if want := clk.Now().Add(-2 * time.Minute).Truncate(time.Minute).UTC(); !c.Start.Equal(want) {
		t.Fatalf("start %v, want %v", c.Start, want)
	}
	// Two minutes on, the first bucket has left the window; its slot is
	// reused for the new period, starting from zero.
	clk.SetTime(clk.Now().Add(2 * time.Minute))
	tl.Add("rate_limited")
	if got := fmt.Sprint(series(tl.Chart())); got != "map[ok:[1 0 0] rate_limited:[0 0 1]]" {
		t.Fatalf("after the window moved: %s", got)
	}
	clk.SetTime(clk.Now().Add(time.Hour))
	if c := tl.Chart(); c.Total != 0 || len(c.Series) != 0 {
		t.Fatalf("an hour later the chart still counts %+v", c)
	}
}

func TestTimelineCountsUnknownOutcomesPastTheLimitAsOther(t *testing.T) {
	tl := NewTimeline(TimelineOptions{})
	for i := range maxOutcomes + 5 {
		tl.Add(fmt.Sprintf("o%02d", i))
	}
	c := tl.Chart()
	got := series(c)
	if len(got) != maxOutcomes || got[OutcomeOther] == nil || c.Total != maxOutcomes+5 {
		t.Fatalf("%d series (other: %v), total %d; want %d with the rest as other", len(got), got[OutcomeOther], c.Total, maxOutcomes)
	}
}

func TestTimelineAddIsSafeForConcurrentUse(t *testing.T) {
	tl := NewTimeline(TimelineOptions{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				tl.Add([]string{"ok", "banned"}[g%2])
			}
		}()
	}
	wg.Wait()
	if c := tl.Chart(); c.Total != 8000 {
		t.Fatalf("total %d, want 8000", c.Total)
	}
}

// BenchmarkTimelineAdd is the cost the gateway's request path pays per
// request for the chart.
func BenchmarkTimelineAdd(b *testing.B) {
	tl := NewTimeline(TimelineOptions{})
	outcomes := []string{"ok", "ok", "ok", "banned", "rate_limited", "no_member"}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tl.Add(outcomes[i%len(outcomes)])
			i++
		}
	})
}
