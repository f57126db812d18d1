package sites

import (
	"strings"
	"testing"
	"time"
)

func TestSiteDurationsPickTheMostSpecificPattern(t *testing.T) {
	sd, err := ParseDurations([]string{"*.example.com=20s", "*.api.example.com=40s", "Reports.Example.com.=90s", "10.0.0.7=5s", "[::1]=6s"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		host string
		want time.Duration
		ok   bool
	}{
		{"reports.example.com", 90 * time.Second, true},
		{"REPORTS.example.com.", 90 * time.Second, true},
		{"x.api.example.com", 40 * time.Second, true},
		{"www.example.com", 20 * time.Second, true},
		{"example.com", 0, false}, // *.example.com is the names below it only
		{"10.0.0.7", 5 * time.Second, true},
		{"::1", 6 * time.Second, true},
		{"other.org", 0, false},
	}
	for _, tt := range tests {
		if got, ok := sd.For(tt.host); got != tt.want || ok != tt.ok {
			t.Errorf("For(%q) = %v, %v; want %v, %v", tt.host, got, ok, tt.want, tt.ok)
		}
	}
	if _, ok := (Durations{}).For("example.com"); ok {
		t.Error("the zero Durations names a site")
	}
}

func TestSiteDurationsRefuseWhatDoesNotRead(t *testing.T) {
	tests := []struct {
		name, entry, want string
	}{
		{"no duration", "slow.example", "want PATTERN=DURATION"},
		{"not a duration", "slow.example=soon", "not a positive duration"},
		{"zero", "slow.example=0s", "not a positive duration"},
		{"negative", "slow.example=-3s", "not a positive duration"},
		{"a port in the pattern", "slow.example:443=3s", "host pattern"},
		{"a wildcard inside", "a.*.example=3s", "host pattern"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseDurations([]string{tt.entry})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseDurations(%q) = %v, want an error saying %q", tt.entry, err, tt.want)
			}
		})
	}
	if _, err := ParseDurations([]string{"a.example=1s", "A.EXAMPLE.=2s"}); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("a pattern given twice: %v", err)
	}
}

func TestHostPatterns(t *testing.T) {
	hp, err := ParseHosts([]string{"Pinned.Example.com", "*.bank.example", "10.0.0.1", "[::1]"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		host string
		want bool
	}{
		{"pinned.example.com", true},
		{"PINNED.example.com.", true},
		{"www.pinned.example.com", false},
		{"login.bank.example", true},
		{"a.b.bank.example", true},
		{"bank.example", false},
		{"evilbank.example", false},
		{"10.0.0.1", true},
		{"::1", true},
		{"10.0.0.2", false},
	}
	for _, tc := range tests {
		if got := hp.Match(tc.host); got != tc.want {
			t.Errorf("Match(%q) = %v, want %v", tc.host, got, tc.want)
		}
	}
	for _, bad := range []string{"", "example.com:443", "https://example.com", "a*.example.com", "ex ample.com", "*", "fe80::1%eth0", "[::%ſ]"} {
		if _, err := ParseHosts([]string{bad}); err == nil {
			t.Errorf("ParseHosts(%q) accepted", bad)
		}
	}
}
