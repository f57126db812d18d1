package metrics

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyfleet/proxyfleet/pool"
)

func TestLeaseStoreCallsCountsResultsByOperation(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := NewLeaseStoreCalls(reg)
	l.Observe("acquire", time.Millisecond, nil)
	l.Observe("acquire", time.Millisecond, nil)
	l.Observe("acquire", 3*time.Second, fmt.Errorf("%w: acquire: dial tcp: refused", pool.ErrStoreUnavailable))
	l.Observe("report", time.Millisecond, errors.New("lease store: report: OOM command not allowed"))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := ""
			for _, lp := range m.GetLabel() {
				key += lp.GetName() + "=" + lp.GetValue() + " "
			}
			got[key] = m.GetHistogram().GetSampleCount()
		}
	}
	want := map[string]uint64{"op=acquire result=ok ": 2, "op=acquire result=unavailable ": 1, "op=report result=error ": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("calls by series = %v, want %v", got, want)
	}
}
