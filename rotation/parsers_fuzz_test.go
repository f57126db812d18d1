package rotation

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParseRetryAfter reads a site's Retry-After header: a value that
// reads is a wait of at least a second (never zero, which would read as
// none, never wrapped), one that does not is no wait at all, and
// delta-seconds read exactly, "0" as the second.
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"120", "0", "-1", "1.5", " 30 ", "99999999999999999999", "Wed, 21 Oct 2015 07:28:00 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994", "soon", ""} {
		f.Add(s)
	}
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := ParseRetryAfter(v, now)
		if !ok {
			if d != 0 {
				t.Fatalf("%q: not read, but a wait of %v", v, d)
			}
			return
		}
		if d < minRetryAfter {
			t.Fatalf("%q: a wait of %v, below %v", v, d, minRetryAfter)
		}
		if s := strings.TrimSpace(v); isDigits(s) {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil && n < 1<<32 && d != max(time.Duration(n)*time.Second, minRetryAfter) {
				t.Fatalf("%q: %v, want %ds", v, d, n)
			}
		}
	})
}

// FuzzParseStatusList: a list that reads holds HTTP statuses, each once,
// and reads back the same when written out.
func FuzzParseStatusList(f *testing.F) {
	for _, s := range []string{"429", "403, 503,403", "", " ", "99", "600", "4x9", "429,,503", "+429"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		list, err := ParseStatusList(s)
		if err != nil {
			if !strings.Contains(err.Error(), "status list") {
				t.Fatalf("error %q does not say what it read", err)
			}
			return
		}
		var out []string
		for i, n := range list {
			if n < 100 || n > 599 || slices.Contains(list[:i], n) {
				t.Fatalf("%q: %v holds a non-status or a repeat", s, list)
			}
			out = append(out, strconv.Itoa(n))
		}
		again, err := ParseStatusList(strings.Join(out, ","))
		if err != nil || !slices.Equal(again, list) {
			t.Fatalf("%q: %v written out reads back as %v, %v", s, list, again, err)
		}
	})
}

// FuzzParseTiers: an order that reads has 1 to 16 tiers, each a valid
// name once, and reads back the same when written out.
func FuzzParseTiers(f *testing.F) {
	for _, s := range []string{"", "own,datacenter,residential,mobile", " own , residential ", "own,,x", "own,own", "Own", "4g", "a-b,c9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		tiers, err := ParseTiers(v)
		if err != nil {
			return
		}
		if len(tiers) < 1 || len(tiers) > maxTiers {
			t.Fatalf("%q: %d tiers", v, len(tiers))
		}
		for i, n := range tiers {
			if !validTierName(n) || slices.Index(tiers, n) != i {
				t.Fatalf("%q: tier %d %q invalid or named twice in %v", v, i, n, tiers)
			}
		}
		again, err := ParseTiers(strings.Join(tiers, ","))
		if err != nil || !slices.Equal(again, tiers) {
			t.Fatalf("%q: %v reads back as %v, %v", v, tiers, again, err)
		}
	})
}
