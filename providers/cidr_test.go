package providers_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/proxyfleet/proxyfleet/providers"
)

func TestParseCIDRsNamesEachBadEntryInTheFilesOrder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		list     []string
		want     []netip.Prefix
		problems []string
	}{
		{"nothing is fine", nil, nil, nil},
		{"CIDRs of both families parse in order", []string{"203.0.113.0/24", "2001:db8::/32", "10.0.0.1/32"},
			[]netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("10.0.0.1/32")}, nil},
		{"a bare address is not a CIDR", []string{"203.0.113.7"}, nil,
			[]string{`x.ranges[0] "203.0.113.7" is not a CIDR (like 203.0.113.0/24)`}},
		{"host bits set names the CIDR it probably meant", []string{"10.0.0.0/8", "203.0.113.7/24"}, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			[]string{`x.ranges[1] "203.0.113.7/24" has host bits set (did you mean 203.0.113.0/24?)`}},
		{"every bad entry is named, not only the first", []string{"me", "10.0.0.0/33", "192.0.2.0/24"}, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
			[]string{`x.ranges[0] "me" is not a CIDR (like 203.0.113.0/24)`, `x.ranges[1] "10.0.0.0/33" is not a CIDR (like 203.0.113.0/24)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := providers.ParseCIDRs("x.ranges", tc.list)
			if !slices.Equal(got, tc.want) || !slices.Equal(problems, tc.problems) {
				t.Fatalf("ParseCIDRs(%q) = %v, %q; want %v, %q", tc.list, got, problems, tc.want, tc.problems)
			}
		})
	}
}
