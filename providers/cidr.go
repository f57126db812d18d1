package providers

import (
	"fmt"
	"net/netip"
)

// ParseCIDRs parses the CIDR list of a provider's config field (source
// ranges, cluster ranges), in order, and says what is wrong with each entry
// that is not a CIDR, naming field and index. An address with host bits set
// is refused with the masked form it probably meant: a firewall or ACL
// opened to 203.0.113.7/24 is a typo more often than a wish for the /24.
// The problems are nil when every entry parsed.
func ParseCIDRs(field string, list []string) ([]netip.Prefix, []string) {
	var out []netip.Prefix
	var problems []string
	for i, s := range list {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s[%d] %q is not a CIDR (like 203.0.113.0/24)", field, i, s))
		case p.Masked() != p:
			problems = append(problems, fmt.Sprintf("%s[%d] %q has host bits set (did you mean %s?)", field, i, s, p.Masked()))
		default:
			out = append(out, p)
		}
	}
	return out, problems
}
