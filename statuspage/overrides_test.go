package statuspage

import (
	"strings"
	"testing"
	"time"
)

func TestGatewayViewSaysWhenRestingMembersAreTriedAnyway(t *testing.T) {
	now := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		o         *Overrides
		wantError string
		wantNote  string
	}{
		{"none", nil, "", ""},
		{"running: an error", &Overrides{Since: now.Add(-time.Minute), Last: now, Count: 7, Member: "sq2"},
			"tries them anyway, least recently failed first (7 leases, the latest on sq2", ""},
		{"over a minute ago: a note", &Overrides{Since: now.Add(-2 * time.Minute), Last: now.Add(-time.Minute), Count: 3, Member: "sq1", Over: true},
			"", "the gateway tried them anyway (3 leases"},
		{"over long ago: nothing", &Overrides{Since: now.Add(-time.Hour), Last: now.Add(-30 * time.Minute), Count: 3, Member: "sq1", Over: true}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Gateway(GatewayInput{Pool: PoolSnapshot{Overrides: tt.o}}, now)
			check := func(what string, got []string, want string) {
				t.Helper()
				joined := strings.Join(got, "\n")
				if want == "" && strings.Contains(joined, "rest") {
					t.Fatalf("%s %q, want none about resting members", what, joined)
				}
				if want != "" && !strings.Contains(joined, want) {
					t.Fatalf("%s %q, want it to say %q", what, joined, want)
				}
			}
			check("errors", v.Errors, tt.wantError)
			check("notes", v.Notes, tt.wantNote)
			if (v.FailureRestOverrides != nil) != (tt.wantError != "" || tt.wantNote != "") {
				t.Fatalf("failureRestOverrides = %+v", v.FailureRestOverrides)
			}
		})
	}
}

func TestGatewayViewNamesTheStoreItRidesOut(t *testing.T) {
	now := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	o := &Outage{Since: now.Add(-time.Minute), ListAt: now.Add(-2 * time.Minute), GraceEnds: now.Add(4 * time.Minute)}
	for poolAPI, want := range map[string]string{"": "The lease store has not answered", "http://controller:8090": "The lease API has not answered"} {
		v := Gateway(GatewayInput{Pool: PoolSnapshot{Outage: o}, PoolAPI: poolAPI}, now)
		if got := strings.Join(v.Errors, "\n"); !strings.Contains(got, want) {
			t.Fatalf("pool API %q: errors %q, want %q", poolAPI, got, want)
		}
	}
}
