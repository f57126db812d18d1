// Package clustertargets is the one definition of the ranges a cluster may
// let its gateways and Squid Pods reach although they are private: the
// cluster's own pod and service CIDRs, for sites that run in the cluster
// (a test or demo cluster, `make cluster`). It parses and checks the list
// (--cluster-target-cidrs, the chart's clusterTargets.cidrs) and cuts the
// admitted ranges out of a deny list (the Squid ACL).
//
// Only ranges inside the private ranges may be admitted: a public range
// needs no admitting, and loopback, link-local (the cloud metadata
// address) and the rest of the special ranges are never a cluster's pod or
// service range, so admitting them could only open the gateway by mistake.
//
// It imports the standard library only.
package clustertargets

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// privateRanges are the ranges an admitted CIDR must lie inside: RFC 1918,
// CGNAT (some clusters' pod ranges) and IPv6 unique-local.
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("fc00::/7"),
}

// Parse reads the admitted CIDRs, each entry one CIDR (callers split
// comma-separated flag values first; blanks are skipped). An entry that is
// no CIDR, has host bits set, or is not inside a private range (RFC 1918,
// 100.64.0.0/10, fc00::/7) is an error naming it.
func Parse(entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		p, err := netip.ParsePrefix(e)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%q is not a CIDR (want the cluster's pod or service range, e.g. 10.244.0.0/16)", e)
		case p.Masked() != p:
			return nil, fmt.Errorf("%q has host bits set (did you mean %s?)", e, p.Masked())
		case !private(p):
			return nil, fmt.Errorf("%q is not inside a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, fc00::/7): only a cluster's own pod and service ranges may be admitted", e)
		}
		out = append(out, p)
	}
	return out, nil
}

// Check refuses a parsed list Parse would have refused: a prefix with host
// bits set or outside the private ranges (for callers given prefixes, not
// text, such as gateway.Options).
func Check(ps []netip.Prefix) error {
	for _, p := range ps {
		if p.Masked() != p || !private(p) {
			return fmt.Errorf("%s is not a private CIDR (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, fc00::/7): only a cluster's own pod and service ranges may be admitted", p)
		}
	}
	return nil
}

func private(p netip.Prefix) bool {
	if p.Addr().Is4In6() {
		return false
	}
	for _, r := range privateRanges {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// Contains reports whether a is inside one of ps. An IPv4-mapped address
// is judged by the IPv4 address it carries.
func Contains(ps []netip.Prefix, a netip.Addr) bool {
	a = a.WithZone("").Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Subtract returns the ranges of from with every address of minus cut out,
// as the fewest prefixes a split at the prefix boundaries gives (10.0.0.0/8
// minus 10.244.0.0/16 is eight prefixes), sorted. A deny list with an
// admitted range cut out this way refuses every other address it refused
// before, whatever a name resolves to.
func Subtract(from, minus []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range from {
		out = append(out, cut(p.Masked(), minus)...)
	}
	sort.Slice(out, func(i, j int) bool {
		if c := out[i].Addr().Compare(out[j].Addr()); c != 0 {
			return c < 0
		}
		return out[i].Bits() < out[j].Bits()
	})
	return out
}

// cut is p without the addresses of minus: p whole when nothing of minus
// overlaps it, nothing when one of minus covers it, else its two halves,
// each cut in turn.
func cut(p netip.Prefix, minus []netip.Prefix) []netip.Prefix {
	overlaps := false
	for _, m := range minus {
		m = m.Masked()
		if m.Addr().BitLen() != p.Addr().BitLen() || !m.Overlaps(p) {
			continue
		}
		if m.Bits() <= p.Bits() {
			return nil // m covers p
		}
		overlaps = true
	}
	if !overlaps {
		return []netip.Prefix{p}
	}
	lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
	hiAddr := p.Addr().As16()
	bit := p.Bits()
	if p.Addr().Is4() {
		bit += 96
	}
	hiAddr[bit/8] |= 0x80 >> (bit % 8)
	hi := netip.AddrFrom16(hiAddr)
	if p.Addr().Is4() {
		hi = hi.Unmap()
	}
	return append(cut(lo, minus), cut(netip.PrefixFrom(hi, p.Bits()+1), minus)...)
}
