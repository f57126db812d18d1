package hetzner

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"

	"github.com/proxyfleet/proxyfleet/providers"
)

// sshPort is opened only to SSHSourceRanges, and only when they are given.
const sshPort = 22

// firewallName is the managed firewall of an entry and installation: one
// per pair, so two clusters sharing a project never rewrite each other's
// rules.
func firewallName(entry, installation string) string {
	n := "proxyfleet-" + firstNonEmpty(entry, Type)
	if installation != "" {
		n += "-" + installation
	}
	return n
}

// ensureFirewall returns the ID of the managed firewall of the entry and
// req's installation, made when missing and brought to exactly these
// inbound rules: the proxy port of req from SourceRanges, port 22 from
// SSHSourceRanges when given, and nothing else (a rule added by hand is
// dropped); no outbound rule, which Hetzner reads as every destination
// allowed (the Squid needs to reach sites). Ports of other Proxies opened
// to SourceRanges stay, as those Proxies may still use them. Creates of
// one provider take turns, so two never replace each other's port; the
// server is created with the firewall applied.
func (p *Provider) ensureFirewall(ctx context.Context, req providers.CreateRequest) (int64, error) {
	name := firewallName(p.cfg.Entry, req.Installation)
	unlock, err := p.locks.Lock(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("%w: waiting to update firewall %s: %w", providers.ErrTransient, name, err)
	}
	defer unlock()
	fw, err := p.findFirewall(ctx, name)
	if err != nil {
		return 0, err
	}
	if fw == nil {
		labels := map[string]string{LabelManagedBy: ManagedBy, LabelEntry: firstNonEmpty(p.cfg.Entry, Type)}
		if req.Installation != "" {
			labels[LabelInstallation] = req.Installation
		}
		res, _, err := p.client.Firewall.Create(ctx, hcloud.FirewallCreateOpts{Name: name, Labels: labels, Rules: p.rules(nil, req.Port)})
		if codeOf(err) == hcloud.ErrorCodeUniquenessError {
			// Another controller of this installation made it a
			// moment ago: use it next time round.
			return 0, fmt.Errorf("%w: firewall %s was made meanwhile: %w", providers.ErrTransient, name, err)
		}
		if err != nil {
			return 0, classify("creating firewall "+name, err)
		}
		return res.Firewall.ID, nil
	}
	if fw.Labels[LabelManagedBy] != ManagedBy {
		return 0, fmt.Errorf("%w: firewall %s exists but is not proxyfleet's (no %s label); name another entry or label it",
			providers.ErrPermanent, name, LabelManagedBy)
	}
	want := p.rules(fw.Rules, req.Port)
	if rulesKey(want) == rulesKey(fw.Rules) {
		return fw.ID, nil
	}
	if _, _, err := p.client.Firewall.SetRules(ctx, fw, hcloud.FirewallSetRulesOpts{Rules: want}); err != nil {
		return 0, classify("opening port "+strconv.Itoa(req.Port)+" in firewall "+name, err)
	}
	return fw.ID, nil
}

// findFirewall looks the managed firewall up by name (unique in a
// project); nil when there is none.
func (p *Provider) findFirewall(ctx context.Context, name string) (*hcloud.Firewall, error) {
	fws, _, err := p.client.Firewall.List(ctx, hcloud.FirewallListOpts{Name: name})
	if err != nil {
		return nil, classify("looking up firewall "+name, err)
	}
	for _, fw := range fws {
		if fw.Name == name {
			return fw, nil
		}
	}
	return nil, nil
}

// rules are the inbound rules the firewall must have: port from
// SourceRanges, every other single TCP port have opens (another Proxy's)
// from SourceRanges too, port 22 from SSHSourceRanges when given.
func (p *Provider) rules(have []hcloud.FirewallRule, port int) []hcloud.FirewallRule {
	ports := map[int]bool{port: true}
	for _, r := range have {
		if r.Direction != hcloud.FirewallRuleDirectionIn || r.Protocol != hcloud.FirewallRuleProtocolTCP || r.Port == nil {
			continue
		}
		if n, err := strconv.Atoi(*r.Port); err == nil && n >= 1 && n <= 65535 && n != sshPort {
			ports[n] = true
		}
	}
	sorted := make([]int, 0, len(ports))
	for n := range ports {
		sorted = append(sorted, n)
	}
	sort.Ints(sorted)
	var out []hcloud.FirewallRule
	for _, n := range sorted {
		sources := slices.Clone(p.cfg.SourceRanges)
		if n == sshPort {
			sources = append(sources, p.cfg.SSHSourceRanges...)
		}
		out = append(out, rule(n, sources, "proxyfleet: proxy port from the gateways (sourceRanges)"))
	}
	if len(p.cfg.SSHSourceRanges) > 0 && !ports[sshPort] {
		out = append(out, rule(sshPort, p.cfg.SSHSourceRanges, "proxyfleet: SSH from sshSourceRanges"))
	}
	return out
}

func rule(port int, cidrs []string, description string) hcloud.FirewallRule {
	r := hcloud.FirewallRule{Direction: hcloud.FirewallRuleDirectionIn, Protocol: hcloud.FirewallRuleProtocolTCP,
		Port: hcloud.Ptr(strconv.Itoa(port)), Description: hcloud.Ptr(description)}
	for _, c := range cidrs {
		if _, n, err := net.ParseCIDR(c); err == nil {
			r.SourceIPs = append(r.SourceIPs, *n)
		}
	}
	return r
}

// rulesKey is a canonical text of rules, to tell whether setting them
// would change anything.
func rulesKey(rules []hcloud.FirewallRule) string {
	var lines []string
	for _, r := range rules {
		var ips []string
		for _, n := range append(slices.Clone(r.SourceIPs), r.DestinationIPs...) {
			ips = append(ips, n.String())
		}
		slices.Sort(ips)
		port := ""
		if r.Port != nil {
			port = *r.Port
		}
		lines = append(lines, string(r.Direction)+" "+string(r.Protocol)+" "+port+" "+strings.Join(ips, ","))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
