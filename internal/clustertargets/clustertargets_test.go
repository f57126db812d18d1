package clustertargets

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseAdmitsOnlyPrivateCIDRs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []string
		want    string // the prefixes joined, or the error's text
		wantErr bool
	}{
		{"a pod and a service range", []string{"10.244.0.0/16", " 10.96.0.0/12 "}, "10.244.0.0/16 10.96.0.0/12", false},
		{"blanks are skipped", []string{"", "  "}, "", false},
		{"CGNAT and unique-local", []string{"100.64.0.0/16", "fd00:10::/64"}, "100.64.0.0/16 fd00:10::/64", false},
		{"all of 172.16/12", []string{"172.16.0.0/12"}, "172.16.0.0/12", false},
		{"not a CIDR", []string{"10.244.0.0"}, `"10.244.0.0" is not a CIDR`, true},
		{"a name", []string{"cluster.local"}, `"cluster.local" is not a CIDR`, true},
		{"host bits set", []string{"10.244.0.1/16"}, `"10.244.0.1/16" has host bits set (did you mean 10.244.0.0/16?)`, true},
		{"a public range", []string{"8.8.8.0/24"}, `"8.8.8.0/24" is not inside a private range`, true},
		{"wider than 10/8", []string{"10.0.0.0/7"}, `"10.0.0.0/7" is not inside a private range`, true},
		{"everything", []string{"0.0.0.0/0"}, `"0.0.0.0/0" is not inside a private range`, true},
		{"loopback", []string{"127.0.0.0/8"}, `"127.0.0.0/8" is not inside a private range`, true},
		{"link-local, the metadata address", []string{"169.254.169.254/32"}, `is not inside a private range`, true},
		{"IPv4-mapped", []string{"::ffff:10.244.0.0/112"}, `is not inside a private range`, true},
		{"one bad among good", []string{"10.244.0.0/16", "1.2.3.0/24"}, `"1.2.3.0/24"`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Parse(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			var s []string
			for _, p := range got {
				s = append(s, p.String())
			}
			if strings.Join(s, " ") != tc.want {
				t.Fatalf("Parse(%q) = %v, want %s", tc.in, s, tc.want)
			}
		})
	}
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func TestSubtractCutsOutExactlyTheAdmittedRanges(t *testing.T) {
	for _, tc := range []struct {
		name        string
		from, minus []netip.Prefix
		want        string
	}{
		{"nothing admitted", prefixes("10.0.0.0/8", "127.0.0.0/8"), nil, "10.0.0.0/8 127.0.0.0/8"},
		{"a range elsewhere", prefixes("192.168.0.0/16"), prefixes("10.244.0.0/16"), "192.168.0.0/16"},
		{"the whole range", prefixes("10.0.0.0/8"), prefixes("10.0.0.0/8"), ""},
		{"a wider range covers it", prefixes("10.96.0.0/12"), prefixes("10.0.0.0/8"), ""},
		{"a half", prefixes("10.0.0.0/8"), prefixes("10.128.0.0/9"), "10.0.0.0/9"},
		{"a /16 of 10/8", prefixes("10.0.0.0/8"), prefixes("10.244.0.0/16"),
			"10.0.0.0/9 10.128.0.0/10 10.192.0.0/11 10.224.0.0/12 10.240.0.0/14 10.245.0.0/16 10.246.0.0/15 10.248.0.0/13"},
		{"the node's two", prefixes("10.0.0.0/8"), prefixes("10.244.0.0/24", "10.96.0.0/16"),
			"10.0.0.0/10 10.64.0.0/11 10.97.0.0/16 10.98.0.0/15 10.100.0.0/14 10.104.0.0/13 10.112.0.0/12 10.128.0.0/10 10.192.0.0/11 10.224.0.0/12 10.240.0.0/14 10.244.1.0/24 10.244.2.0/23 10.244.4.0/22 10.244.8.0/21 10.244.16.0/20 10.244.32.0/19 10.244.64.0/18 10.244.128.0/17 10.245.0.0/16 10.246.0.0/15 10.248.0.0/13"},
		{"IPv6 beside IPv4", prefixes("fc00::/7", "10.0.0.0/8"), prefixes("fd00::/8"), "10.0.0.0/8 fc00::/8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Subtract(tc.from, tc.minus)
			var s []string
			for _, p := range got {
				s = append(s, p.String())
			}
			if strings.Join(s, " ") != tc.want {
				t.Fatalf("Subtract = %s\nwant       %s", strings.Join(s, " "), tc.want)
			}
			// Every address is in exactly one of the result and minus, or
			// in neither when it was not in from.
			for _, a := range []string{"10.0.0.1", "10.96.0.10", "10.96.255.255", "10.97.0.0", "10.244.0.5", "10.244.1.0", "10.255.255.255", "127.0.0.1", "192.168.1.1", "fd00::1", "fc00::1", "8.8.8.8"} {
				addr := netip.MustParseAddr(a)
				in := Contains(got, addr)
				want := Contains(tc.from, addr) && !Contains(tc.minus, addr)
				if in != want {
					t.Errorf("%s in the result: %v, want %v", a, in, want)
				}
			}
		})
	}
}

func TestContainsJudgesMappedAddressesByTheirIPv4(t *testing.T) {
	ps := prefixes("10.244.0.0/16")
	if !Contains(ps, netip.MustParseAddr("::ffff:10.244.0.7")) {
		t.Error("a mapped pod address is not contained")
	}
	if Contains(ps, netip.MustParseAddr("10.245.0.1")) {
		t.Error("an address outside the range is contained")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"10.244.0.0/16", "fd00::/8", "8.8.8.0/24", "10.0.0.1/8", "::ffff:10.0.0.0/104", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := Parse([]string{s})
		if err != nil {
			return
		}
		for _, p := range ps {
			if !private(p) || p.Masked() != p {
				t.Fatalf("Parse(%q) admitted %s", s, p)
			}
			// Cutting an admitted range out of the private ranges leaves
			// none of its addresses.
			for _, q := range Subtract(privateRanges, ps) {
				if q.Overlaps(p) {
					t.Fatalf("Subtract left %s, which overlaps the admitted %s", q, p)
				}
			}
		}
	})
}
