package rotation

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	custom := Classifier{RateLimit: []int{429, 503}, Ban: []int{403, 503, 451}}
	tests := []struct {
		name   string
		c      Classifier
		status int
		want   Result
	}{
		{"default 429 is rate limited", DefaultClassifier(), 429, ResultRateLimited},
		{"default 403 is banned", DefaultClassifier(), 403, ResultBanned},
		{"default 200 is ok", DefaultClassifier(), 200, ResultOK},
		{"default 503 is ok (not listed)", DefaultClassifier(), 503, ResultOK},
		{"default 404 is ok", DefaultClassifier(), 404, ResultOK},
		{"custom 451 is banned", custom, 451, ResultBanned},
		{"status on both lists is rate limited", custom, 503, ResultRateLimited},
		{"empty classifier says ok to 429", Classifier{}, 429, ResultOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.c.Classify(tc.status); got != tc.want {
				t.Errorf("Classify(%d) = %q, want %q", tc.status, got, tc.want)
			}
		})
	}
}

func TestParseStatusList(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []int
		wantErr string
	}{
		{"single", "429", []int{429}, ""},
		{"several with blanks", " 429 , 503,403", []int{429, 503, 403}, ""},
		{"duplicates dropped", "429,429,503", []int{429, 503}, ""},
		{"empty string turns the signal off", "", []int{}, ""},
		{"blank string turns the signal off", "  ", []int{}, ""},
		{"bounds are inclusive", "100,599", []int{100, 599}, ""},
		{"not a number names the item", "429,abc", nil, `item 2 ("abc") is not a number`},
		{"out of range names the item", "429,600", nil, "item 2 (600) is not an HTTP status"},
		{"below range", "99", nil, "item 1 (99) is not an HTTP status"},
		{"empty item is an error", "429,,503", nil, "item 2 is empty"},
		{"trailing comma is an error", "429,", nil, "item 2 is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStatusList(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseStatusList(%q) error = %v, want it to contain %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseStatusList(%q): %v", tc.in, err)
			}
			if !slices.Equal(got, tc.want) || got == nil {
				t.Errorf("ParseStatusList(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"delta seconds", "120", 120 * time.Second, true},
		{"delta seconds with blanks", " 2 ", 2 * time.Second, true},
		{"zero seconds is valid and means a short rest, not the default", "0", time.Second, true},
		{"RFC 1123 date in the future", "Sat, 01 Mar 2025 12:00:30 GMT", 30 * time.Second, true},
		{"RFC 850 date in the future", "Saturday, 01-Mar-25 12:01:00 GMT", time.Minute, true},
		{"ANSI C date in the future", "Sat Mar  1 12:00:05 2025", 5 * time.Second, true},
		{"date in the past is valid with a short rest", "Sat, 01 Mar 2025 11:00:00 GMT", time.Second, true},
		{"date equal to now is valid with a short rest", "Sat, 01 Mar 2025 12:00:00 GMT", time.Second, true},
		{"negative is rejected", "-5", 0, false},
		{"fraction is rejected", "1.5", 0, false},
		{"plus sign is rejected", "+5", 0, false},
		{"garbage is rejected", "soon", 0, false},
		{"empty is rejected", "", 0, false},
		{"huge value saturates instead of overflowing", "99999999999999999999999", time.Duration(math.MaxInt64), true},
		{"just above the duration range saturates", "9223372037", time.Duration(math.MaxInt64), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseRetryAfter(tc.in, now)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("ParseRetryAfter(%q) = (%v, %v), want (%v, %v)", tc.in, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestCooldownWindow(t *testing.T) {
	p := CooldownPolicy{Default: 10 * time.Minute, Max: time.Hour}
	tests := []struct {
		name       string
		p          CooldownPolicy
		retryAfter time.Duration
		strikes    int
		want       time.Duration
	}{
		{"first ban without Retry-After is the default", p, 0, 1, 10 * time.Minute},
		{"Retry-After replaces the default", p, 2 * time.Second, 1, 2 * time.Second},
		{"second consecutive ban doubles", p, 0, 2, 20 * time.Minute},
		{"third consecutive ban doubles again", p, 0, 3, 40 * time.Minute},
		{"fourth is capped at max", p, 0, 4, time.Hour},
		{"backoff doubles Retry-After too", p, 2 * time.Second, 3, 8 * time.Second},
		{"Retry-After above max is capped", p, 5 * time.Hour, 1, time.Hour},
		{"zero strikes count as one", p, 0, 0, 10 * time.Minute},
		{"negative Retry-After uses the default", p, -time.Second, 1, 10 * time.Minute},
		{"huge strike count stays at the cap", p, 0, 1 << 30, time.Hour},
		{"no cap never overflows", CooldownPolicy{Default: time.Hour}, 0, 1000, time.Duration(math.MaxInt64)},
		{"saturated Retry-After is capped", p, time.Duration(math.MaxInt64), 3, time.Hour},
		{"no default and no Retry-After is no cooldown", CooldownPolicy{Max: time.Hour}, 0, 3, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Window(tc.retryAfter, tc.strikes); got != tc.want {
				t.Errorf("Window(%v, %d) = %v, want %v", tc.retryAfter, tc.strikes, got, tc.want)
			}
		})
	}
}

func TestBackoffSequenceResetsAfterSuccess(t *testing.T) {
	// The store counts strikes; a success resets them to zero, so the next
	// ban starts from the base window again.
	p := CooldownPolicy{Default: time.Minute, Max: 5 * time.Minute}
	var got []time.Duration
	strikes := 0
	for _, banned := range []bool{true, true, true, true, false, true} {
		if !banned {
			strikes = 0
			continue
		}
		strikes++
		got = append(got, p.Window(0, strikes))
	}
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, time.Minute}
	if !slices.Equal(got, want) {
		t.Errorf("windows = %v, want %v", got, want)
	}
}
