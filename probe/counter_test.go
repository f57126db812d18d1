package probe

import "testing"

// TestCounter pins when a verdict flips: the first result at once, then only
// after a threshold's run of the other kind, a run broken by one result of
// the other kind starting over.
func TestCounter(t *testing.T) {
	type step struct {
		ok             bool
		healthy, known bool // the verdict after the step
	}
	tests := []struct {
		name          string
		start         Counter
		success, fail int
		steps         []step
	}{
		{name: "no result is no verdict", success: 1, fail: 3},
		{name: "a first success is healthy at once", success: 3, fail: 3,
			steps: []step{{ok: true, healthy: true, known: true}}},
		{name: "a first failure is unhealthy at once", success: 1, fail: 3,
			steps: []step{{ok: false, healthy: false, known: true}}},
		{name: "a healthy proxy turns unhealthy only after failureThreshold failures in a row", success: 1, fail: 3,
			steps: []step{
				{ok: true, healthy: true, known: true},
				{ok: false, healthy: true, known: true},
				{ok: false, healthy: true, known: true},
				{ok: false, healthy: false, known: true},
			}},
		{name: "one success restarts the failure run", success: 1, fail: 2,
			steps: []step{
				{ok: true, healthy: true, known: true},
				{ok: false, healthy: true, known: true},
				{ok: true, healthy: true, known: true},
				{ok: false, healthy: true, known: true},
				{ok: false, healthy: false, known: true},
			}},
		{name: "an unhealthy proxy turns healthy only after successThreshold successes in a row", success: 2, fail: 3,
			steps: []step{
				{ok: false, healthy: false, known: true},
				{ok: true, healthy: false, known: true},
				{ok: false, healthy: false, known: true},
				{ok: true, healthy: false, known: true},
				{ok: true, healthy: true, known: true},
			}},
		{name: "a seeded healthy verdict needs a full failure run", start: Seeded(true), success: 1, fail: 2,
			steps: []step{
				{ok: false, healthy: true, known: true},
				{ok: false, healthy: false, known: true},
			}},
		{name: "a seeded unhealthy verdict is not overturned by the first result", start: Seeded(false), success: 2, fail: 3,
			steps: []step{
				{ok: true, healthy: false, known: true},
				{ok: true, healthy: true, known: true},
			}},
		{name: "thresholds of zero count as one", success: 0, fail: 0,
			steps: []step{
				{ok: true, healthy: true, known: true},
				{ok: false, healthy: false, known: true},
				{ok: true, healthy: true, known: true},
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.start
			if len(tc.steps) == 0 {
				if h, k := c.Verdict(); h || k {
					t.Fatalf("verdict = healthy %v known %v, want none", h, k)
				}
			}
			for i, s := range tc.steps {
				c.Observe(s.ok, tc.success, tc.fail)
				if h, k := c.Verdict(); h != s.healthy || k != s.known {
					t.Fatalf("step %d (ok=%v): healthy %v known %v, want healthy %v known %v", i, s.ok, h, k, s.healthy, s.known)
				}
			}
		})
	}
}
