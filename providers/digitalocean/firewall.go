package digitalocean

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/digitalocean/godo"

	"github.com/proxyfleet/proxyfleet/providers"
)

// sshPort is opened only to SSHSourceRanges, and only when they are given.
const sshPort = 22

// allPorts is how DigitalOcean spells every port of a protocol.
const allPorts = "0"

// firewallName is the managed firewall of an entry and installation.
func firewallName(entry, installation string) string {
	n := "proxyfleet-" + firstNonEmpty(entry, Type)
	if installation != "" {
		n += "-" + installation
	}
	return n
}

// ensureFirewall brings the managed firewall of the entry and req's
// installation to exactly what it must be, making it when missing: it
// applies to the droplets tagged firewallTag, admits the proxy port of
// req from SourceRanges, port 22 from SSHSourceRanges when given, and
// nothing else inbound (a rule added by hand is dropped); every
// destination outbound, which the Squid needs to reach sites. Ports of
// other Proxies opened to SourceRanges stay, as those Proxies may still
// use them. Creates of one provider take turns, so two never replace each
// other's port; the firewall is in place before the droplet is created.
func (p *Provider) ensureFirewall(ctx context.Context, req providers.CreateRequest) error {
	name, tag := firewallName(p.cfg.Entry, req.Installation), firewallTag(p.cfg.Entry, req.Installation)
	unlock, err := p.locks.Lock(ctx, name)
	if err != nil {
		return fmt.Errorf("%w: waiting to update firewall %s: %w", providers.ErrTransient, name, err)
	}
	defer unlock()
	fw, err := p.findFirewall(ctx, name)
	if err != nil {
		return err
	}
	if fw == nil {
		// The tag is made first, so the firewall never names a tag the
		// account lacks (the in-test API refuses one, to hold the order).
		if _, _, err := p.client.Tags.Create(ctx, &godo.TagCreateRequest{Name: tag}); err != nil {
			return classify("creating tag "+tag, err)
		}
		if _, _, err := p.client.Firewalls.Create(ctx, p.firewallRequest(name, tag, nil, req.Port)); err != nil {
			return classify("creating firewall "+name, err)
		}
		return nil
	}
	if !slices.Equal(fw.Tags, []string{tag}) || len(fw.DropletIDs) > 0 {
		return fmt.Errorf("%w: firewall %s exists but is not proxyfleet's (it applies to %v and droplets %v, not tag %s alone); name another entry or remove it",
			providers.ErrPermanent, name, fw.Tags, fw.DropletIDs, tag)
	}
	want := p.firewallRequest(name, tag, fw.InboundRules, req.Port)
	if rulesKey(want.InboundRules, want.OutboundRules) == rulesKey(fw.InboundRules, fw.OutboundRules) {
		return nil
	}
	if _, _, err := p.client.Firewalls.Update(ctx, fw.ID, want); err != nil {
		return classify("opening port "+strconv.Itoa(req.Port)+" in firewall "+name, err)
	}
	return nil
}

// findFirewall looks the managed firewall up by name on every page; nil
// when there is none.
func (p *Provider) findFirewall(ctx context.Context, name string) (*godo.Firewall, error) {
	opt := &godo.ListOptions{Page: 1, PerPage: 200}
	for {
		page, resp, err := p.client.Firewalls.List(ctx, opt)
		if err != nil {
			return nil, classify("looking up firewall "+name, err)
		}
		for i := range page {
			if page[i].Name == name {
				return &page[i], nil
			}
		}
		if resp == nil || resp.Links == nil || resp.Links.IsLastPage() || len(page) == 0 {
			return nil, nil
		}
		opt.Page++
	}
}

// firewallRequest is the firewall as it must be: port from SourceRanges,
// every other single TCP port have opens from SourceRanges too (another
// Proxy's), port 22 from SSHSourceRanges when given; all outbound.
func (p *Provider) firewallRequest(name, tag string, have []godo.InboundRule, port int) *godo.FirewallRequest {
	ports := map[int]bool{port: true}
	for _, r := range have {
		n, err := strconv.Atoi(r.PortRange)
		if r.Protocol != "tcp" || err != nil || n < 1 || n > 65535 || n == sshPort {
			continue
		}
		ports[n] = true
	}
	sorted := make([]int, 0, len(ports))
	for n := range ports {
		sorted = append(sorted, n)
	}
	sort.Ints(sorted)
	var in []godo.InboundRule
	for _, n := range sorted {
		sources := slices.Clone(p.cfg.SourceRanges)
		if n == sshPort {
			sources = append(sources, p.cfg.SSHSourceRanges...)
		}
		in = append(in, godo.InboundRule{Protocol: "tcp", PortRange: strconv.Itoa(n), Sources: &godo.Sources{Addresses: sources}})
	}
	if len(p.cfg.SSHSourceRanges) > 0 && !ports[sshPort] {
		in = append(in, godo.InboundRule{Protocol: "tcp", PortRange: strconv.Itoa(sshPort), Sources: &godo.Sources{Addresses: slices.Clone(p.cfg.SSHSourceRanges)}})
	}
	everywhere := func() *godo.Destinations { return &godo.Destinations{Addresses: []string{"0.0.0.0/0", "::/0"}} }
	out := []godo.OutboundRule{
		{Protocol: "tcp", PortRange: allPorts, Destinations: everywhere()},
		{Protocol: "udp", PortRange: allPorts, Destinations: everywhere()},
		{Protocol: "icmp", Destinations: everywhere()},
	}
	return &godo.FirewallRequest{Name: name, InboundRules: in, OutboundRules: out, Tags: []string{tag}}
}

// rulesKey is a canonical text of a firewall's rules, to tell whether an
// update would change anything.
func rulesKey(in []godo.InboundRule, out []godo.OutboundRule) string {
	var lines []string
	for _, r := range in {
		var a []string
		if r.Sources != nil {
			a = slices.Sorted(slices.Values(append(slices.Clone(r.Sources.Addresses), r.Sources.Tags...)))
		}
		lines = append(lines, "in "+r.Protocol+" "+r.PortRange+" "+strings.Join(a, ","))
	}
	for _, r := range out {
		var a []string
		if r.Destinations != nil {
			a = slices.Sorted(slices.Values(append(slices.Clone(r.Destinations.Addresses), r.Destinations.Tags...)))
		}
		ports := r.PortRange
		if r.Protocol == "icmp" {
			ports = ""
		}
		lines = append(lines, "out "+r.Protocol+" "+ports+" "+strings.Join(a, ","))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
