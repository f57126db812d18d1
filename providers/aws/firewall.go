package aws

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/proxyfleet/proxyfleet/providers"
)

// sshPort is opened only to SSHSourceRanges, and only when they are given.
const sshPort = 22

// groupName is the managed security group of an entry and installation:
// one per pair, so two clusters sharing a VPC never rewrite each other's
// rules.
func groupName(entry, installation string) string {
	n := "proxyfleet-" + firstNonEmpty(entry, "aws")
	if installation != "" {
		n += "-" + installation
	}
	return n
}

// securityGroups returns the groups an instance of req is launched in: the
// operator's own (SecurityGroupIDs), as given and never touched, or the
// managed group, made when missing and brought to exactly the configured
// ingress: the proxy port of req from SourceRanges, port 22 from
// SSHSourceRanges, nothing else (a rule added by hand is revoked). Ports of
// other Proxies opened to SourceRanges stay, as those Proxies may still
// use them. managed reports the managed group: it was seen or made a
// moment ago, so a RunInstances that does not see it yet (EC2 is
// eventually consistent) is retried, not failed.
func (p *Provider) securityGroups(ctx context.Context, req providers.CreateRequest) (ids []string, managed bool, err error) {
	if len(p.cfg.SecurityGroupIDs) > 0 {
		return p.cfg.SecurityGroupIDs, false, nil
	}
	name := groupName(p.cfg.Entry, req.Installation)
	g, err := p.findGroup(ctx, name)
	if err != nil {
		return nil, false, err
	}
	if g == nil {
		if g, err = p.createGroup(ctx, name, req.Installation); err != nil {
			return nil, false, err
		}
	}
	id := awssdk.ToString(g.GroupId)
	add, revoke := ingressChanges(g.IpPermissions, req.Port, p.cfg.SourceRanges, p.cfg.SSHSourceRanges)
	// One revocation per permission: EC2 refuses a whole call when one of
	// its rules is gone already (a concurrent Create revoked it).
	for _, perm := range revoke {
		_, err := p.client.RevokeSecurityGroupIngress(ctx, &ec2.RevokeSecurityGroupIngressInput{GroupId: awssdk.String(id), IpPermissions: []types.IpPermission{perm}})
		if err != nil && errorCode(err) != "InvalidPermission.NotFound" {
			return nil, false, classify("revoking ingress rules of security group "+name, err)
		}
	}
	if len(add) > 0 {
		_, err := p.client.AuthorizeSecurityGroupIngress(ctx, &ec2.AuthorizeSecurityGroupIngressInput{GroupId: awssdk.String(id), IpPermissions: add})
		// A concurrent Create may have added the same rule a moment ago.
		if err != nil && errorCode(err) != "InvalidPermission.Duplicate" {
			return nil, false, classify("opening port "+fmt.Sprint(req.Port)+" in security group "+name, err)
		}
	}
	return []string{id}, true, nil
}

// findGroup looks the managed group up by name (in the entry's VPC, or the
// default VPC's when none is named); nil when there is none.
func (p *Provider) findGroup(ctx context.Context, name string) (*types.SecurityGroup, error) {
	filters := []types.Filter{{Name: awssdk.String("group-name"), Values: []string{name}}}
	if p.cfg.VpcID != "" {
		filters = append(filters, types.Filter{Name: awssdk.String("vpc-id"), Values: []string{p.cfg.VpcID}})
	}
	out, err := p.client.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{Filters: filters})
	if err != nil {
		return nil, classify("looking up security group "+name, err)
	}
	for i := range out.SecurityGroups {
		g := &out.SecurityGroups[i]
		// A group of that name that is not proxyfleet's is never taken
		// over: its rules are someone else's.
		if tagMap(g.Tags)[TagManagedBy] != ManagedBy {
			continue
		}
		return g, nil
	}
	return nil, nil
}

// createGroup makes the managed group, tagged as proxyfleet's, with no
// ingress rule (EC2's default for a new group) and EC2's default egress
// (all), which the Squid needs to reach sites. A group of that name made
// by a concurrent Create meanwhile is looked up instead.
func (p *Provider) createGroup(ctx context.Context, name, installation string) (*types.SecurityGroup, error) {
	tags := map[string]string{TagManagedBy: ManagedBy, TagName: name, TagEntry: p.cfg.Entry}
	if installation != "" {
		tags[TagInstallation] = installation
	}
	in := &ec2.CreateSecurityGroupInput{
		GroupName:         awssdk.String(name),
		Description:       awssdk.String("proxyfleet upstream proxies of entry " + p.cfg.Entry + ": the proxy port from the gateways only"),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeSecurityGroup, Tags: tagList(tags)}},
	}
	if p.cfg.VpcID != "" {
		in.VpcId = awssdk.String(p.cfg.VpcID)
	}
	out, err := p.client.CreateSecurityGroup(ctx, in)
	if errorCode(err) == "InvalidGroup.Duplicate" {
		g, err := p.findGroup(ctx, name)
		if err == nil && g == nil {
			return nil, fmt.Errorf("%w: security group %s exists but is not proxyfleet's (no %s tag); name another entry or tag it", providers.ErrPermanent, name, TagManagedBy)
		}
		return g, err
	}
	if err != nil {
		return nil, classify("creating security group "+name, err)
	}
	return &types.SecurityGroup{GroupId: out.GroupId, GroupName: awssdk.String(name)}, nil
}

// ingressChanges compares a group's ingress with what it must be: port
// from sources, port 22 from ssh, and any other single TCP port from
// sources only (other Proxies' ports). It returns the permissions to add
// and to revoke; a permission of another protocol, a port range, a source
// group or a prefix list is revoked whole.
func ingressChanges(have []types.IpPermission, port int, sources, ssh []string) (add, revoke []types.IpPermission) {
	allowed := func(p int) []string {
		switch {
		case p == port && p == sshPort:
			return append(slices.Clone(sources), ssh...)
		case p == sshPort:
			return ssh
		}
		return sources
	}
	present := map[int]map[string]bool{}
	for _, perm := range have {
		from, to := int(awssdk.ToInt32(perm.FromPort)), int(awssdk.ToInt32(perm.ToPort))
		if awssdk.ToString(perm.IpProtocol) != "tcp" || from != to || len(perm.UserIdGroupPairs) > 0 || len(perm.PrefixListIds) > 0 {
			revoke = append(revoke, perm)
			continue
		}
		ok := allowed(from)
		var bad types.IpPermission
		for _, r := range perm.IpRanges {
			c := awssdk.ToString(r.CidrIp)
			if slices.Contains(ok, c) {
				mark(present, from, c)
			} else {
				bad.IpRanges = append(bad.IpRanges, types.IpRange{CidrIp: r.CidrIp})
			}
		}
		for _, r := range perm.Ipv6Ranges {
			c := awssdk.ToString(r.CidrIpv6)
			if slices.Contains(ok, c) {
				mark(present, from, c)
			} else {
				bad.Ipv6Ranges = append(bad.Ipv6Ranges, types.Ipv6Range{CidrIpv6: r.CidrIpv6})
			}
		}
		if len(bad.IpRanges)+len(bad.Ipv6Ranges) > 0 {
			bad.IpProtocol, bad.FromPort, bad.ToPort = perm.IpProtocol, perm.FromPort, perm.ToPort
			revoke = append(revoke, bad)
		}
	}
	want := map[int][]string{port: allowed(port)}
	if len(ssh) > 0 {
		want[sshPort] = allowed(sshPort)
	}
	ports := make([]int, 0, len(want))
	for p := range want {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	for _, p := range ports {
		perm := types.IpPermission{IpProtocol: awssdk.String("tcp"), FromPort: awssdk.Int32(int32(p)), ToPort: awssdk.Int32(int32(p))}
		for _, c := range want[p] {
			if present[p][c] {
				continue
			}
			if isIPv6(c) {
				perm.Ipv6Ranges = append(perm.Ipv6Ranges, types.Ipv6Range{CidrIpv6: awssdk.String(c), Description: awssdk.String(ruleDescription(p))})
			} else {
				perm.IpRanges = append(perm.IpRanges, types.IpRange{CidrIp: awssdk.String(c), Description: awssdk.String(ruleDescription(p))})
			}
		}
		if len(perm.IpRanges)+len(perm.Ipv6Ranges) > 0 {
			add = append(add, perm)
		}
	}
	return add, revoke
}

func mark(m map[int]map[string]bool, port int, cidr string) {
	if m[port] == nil {
		m[port] = map[string]bool{}
	}
	m[port][cidr] = true
}

func ruleDescription(port int) string {
	if port == sshPort {
		return "proxyfleet: SSH from sshSourceRanges"
	}
	return "proxyfleet: proxy port from the gateways (sourceRanges)"
}

func isIPv6(cidr string) bool {
	p, err := netip.ParsePrefix(cidr)
	return err == nil && p.Addr().Is6() || strings.Contains(cidr, ":")
}
