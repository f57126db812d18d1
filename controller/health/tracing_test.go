package health

import (
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/spanrec"
)

func TestTraceProbesRecordsTheProbeAndPassesItOn(t *testing.T) {
	sr, tp := spanrec.Provider(t)
	next := &countingProbes{}
	rec := TraceProbes(next, tp)
	rec.ObserveProbe("ns/px", 250*time.Millisecond, false)
	rec.Forget("ns/px")
	if next.observed != 1 || next.forgotten != 1 {
		t.Fatalf("next saw %d probes, %d forgets; want 1, 1", next.observed, next.forgotten)
	}
	spans := sr.Ended()
	if len(spans) != 1 || spans[0].Name() != SpanHealthProbe {
		t.Fatalf("spans %v, want one %s", spanrec.Names(spans), SpanHealthProbe)
	}
	s := spans[0]
	if d := s.EndTime().Sub(s.StartTime()); d != 250*time.Millisecond {
		t.Errorf("span lasts %v, want the probe's 250ms", d)
	}
	if v, _ := spanrec.Attr(s, "proxyfleet.proxy"); v.AsString() != "ns/px" {
		t.Errorf("proxy attribute %q", v.AsString())
	}
	if v, ok := spanrec.Attr(s, "proxyfleet.healthy"); !ok || v.AsBool() {
		t.Errorf("healthy attribute %v %v, want false", v, ok)
	}
}

func TestTraceProbesWithoutAProviderIsNext(t *testing.T) {
	next := &countingProbes{}
	if TraceProbes(next, nil) != ProbeMetrics(next) {
		t.Error("TraceProbes(next, nil) is not next")
	}
}

type countingProbes struct{ observed, forgotten int }

func (c *countingProbes) ObserveProbe(string, time.Duration, bool) { c.observed++ }
func (c *countingProbes) Forget(string)                            { c.forgotten++ }
