package rotation

import (
	"testing"
	"time"
)

func TestMemberEvidence(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		run  func(e *MemberEvidence) bool // the last verdict
		want bool
	}{
		{"three distinct sites make a member broken", func(e *MemberEvidence) bool {
			e.Contradicted("m", "a", t0)
			e.Contradicted("m", "b", t0.Add(time.Second))
			return e.Contradicted("m", "c", t0.Add(2*time.Second))
		}, true},
		{"one site many times is a site ban, not a broken member", func(e *MemberEvidence) bool {
			e.Contradicted("m", "a", t0)
			e.Contradicted("m", "a", t0.Add(time.Second))
			return e.Contradicted("m", "a", t0.Add(2*time.Second))
		}, false},
		{"a success in between clears the record", func(e *MemberEvidence) bool {
			e.Contradicted("m", "a", t0)
			e.Contradicted("m", "b", t0.Add(time.Second))
			e.Reached("m")
			return e.Contradicted("m", "c", t0.Add(2*time.Second))
		}, false},
		{"another member's success does not clear it", func(e *MemberEvidence) bool {
			e.Contradicted("m", "a", t0)
			e.Contradicted("m", "b", t0.Add(time.Second))
			e.Reached("other")
			return e.Contradicted("m", "c", t0.Add(2*time.Second))
		}, true},
		{"failures older than the window do not count", func(e *MemberEvidence) bool {
			e.Contradicted("m", "a", t0)
			e.Contradicted("m", "b", t0.Add(time.Second))
			return e.Contradicted("m", "c", t0.Add(DefaultEvidenceWindow+time.Second))
		}, false},
		{"members are judged apart", func(e *MemberEvidence) bool {
			e.Contradicted("m1", "a", t0)
			e.Contradicted("m2", "b", t0)
			return e.Contradicted("m3", "c", t0)
		}, false},
		{"a verdict starts the record over", func(e *MemberEvidence) bool {
			e.Contradicted("m", "a", t0)
			e.Contradicted("m", "b", t0)
			e.Contradicted("m", "c", t0)
			return e.Contradicted("m", "d", t0)
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.run(NewMemberEvidence(0, 0)); got != tt.want {
				t.Fatalf("verdict %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMemberEvidenceReachedIsFreeWithNoRecord(t *testing.T) {
	e := NewMemberEvidence(2, time.Minute)
	if n := testing.AllocsPerRun(100, func() { e.Reached("m") }); n != 0 {
		t.Fatalf("Reached allocates %v times with no record", n)
	}
	if e.Contradicted("m", "a", time.Now()) || !e.Contradicted("m", "b", time.Now()) {
		t.Fatal("Sites=2 did not judge after two sites")
	}
}
