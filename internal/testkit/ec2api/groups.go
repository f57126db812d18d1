package ec2api

import (
	"encoding/xml"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
)

func (s *Server) describeImages(f url.Values) (any, *Error) {
	filters, e := filtersOf(f)
	if e != nil {
		return nil, e
	}
	owners := indexed(f, "Owner")
	ids := indexed(f, "ImageId")
	for _, id := range ids {
		if !s.imageExists(id) {
			return nil, &Error{Status: 400, Code: "InvalidAMIID.NotFound", Message: fmt.Sprintf("The image id '[%s]' does not exist", id)}
		}
	}
	resp := describeImagesResponse{Xmlns: xmlns, RequestID: s.requestID()}
	for _, img := range s.images {
		if len(owners) > 0 && !slices.Contains(owners, img.Owner) || len(ids) > 0 && !slices.Contains(ids, img.ID) {
			continue
		}
		ok := true
		for name, values := range filters {
			switch name {
			case "name":
				ok = ok && matchAny(values, img.Name)
			case "state":
				ok = ok && matchAny(values, "available")
			case "architecture":
				ok = ok && matchAny(values, img.Architecture)
			case "owner-id":
				ok = ok && matchAny(values, img.Owner)
			default:
				return nil, &Error{Status: 400, Code: "InvalidParameterValue", Message: fmt.Sprintf("The filter '%s' is invalid", name)}
			}
		}
		if ok {
			root := img.RootDevice
			if root == "" {
				root = "/dev/xvda"
			}
			resp.Images = append(resp.Images, imageXML{ID: img.ID, Name: img.Name, Owner: img.Owner, Architecture: img.Architecture,
				Created: img.Created.Format("2006-01-02T15:04:05.000Z"), State: "available", RootDevice: root})
		}
	}
	return resp, nil
}

func (s *Server) describeSecurityGroups(f url.Values) (any, *Error) {
	filters, e := filtersOf(f)
	if e != nil {
		return nil, e
	}
	ids := indexed(f, "GroupId")
	resp := describeSecurityGroupsResponse{Xmlns: xmlns, RequestID: s.requestID()}
	var keys []string
	for id := range s.groups {
		keys = append(keys, id)
	}
	sort.Strings(keys)
	for _, id := range ids {
		if _, ok := s.groups[id]; !ok {
			return nil, &Error{Status: 400, Code: "InvalidGroup.NotFound", Message: fmt.Sprintf("The security group '%s' does not exist", id)}
		}
	}
	for _, id := range keys {
		g := s.groups[id]
		if len(ids) > 0 && !slices.Contains(ids, id) {
			continue
		}
		ok := true
		for name, values := range filters {
			switch {
			case name == "group-name":
				ok = ok && matchAny(values, g.Name)
			case name == "vpc-id":
				ok = ok && matchAny(values, g.VpcID)
			case name == "group-id":
				ok = ok && matchAny(values, g.ID)
			case strings.HasPrefix(name, "tag:"):
				v, has := g.Tags[strings.TrimPrefix(name, "tag:")]
				ok = ok && has && matchAny(values, v)
			default:
				return nil, &Error{Status: 400, Code: "InvalidParameterValue", Message: fmt.Sprintf("The filter '%s' is invalid", name)}
			}
		}
		if ok {
			resp.Groups = append(resp.Groups, groupOf(g))
		}
	}
	return resp, nil
}

func (s *Server) createSecurityGroup(f url.Values) (any, *Error) {
	name, desc := f.Get("GroupName"), f.Get("GroupDescription")
	if name == "" || desc == "" {
		return nil, &Error{Status: 400, Code: "MissingParameter", Message: "The request must contain the parameters GroupName and GroupDescription"}
	}
	vpc := f.Get("VpcId")
	if vpc == "" {
		vpc = s.vpc
	}
	for _, g := range s.groups {
		if g.Name == name && g.VpcID == vpc {
			return nil, &Error{Status: 400, Code: "InvalidGroup.Duplicate", Message: fmt.Sprintf("The security group '%s' already exists for VPC '%s'", name, vpc)}
		}
	}
	g := &SecurityGroup{ID: s.newID("sg-"), Name: name, Description: desc, VpcID: vpc}
	for i := 1; ; i++ {
		p := fmt.Sprintf("TagSpecification.%d.", i)
		rt := f.Get(p + "ResourceType")
		if rt == "" {
			break
		}
		if rt != "security-group" {
			return nil, badParam("'%s' is not a valid taggable resource type for this operation.", rt)
		}
		g.Tags = tagsOf(f, p+"Tag")
	}
	s.groups[g.ID] = g
	return createSecurityGroupResponse{Xmlns: xmlns, RequestID: s.requestID(), GroupID: g.ID}, nil
}

// changeIngress authorizes (add) or revokes ingress permissions, one
// (protocol, ports, range) at a time as EC2 stores them: a duplicate
// authorization or the revocation of a rule that does not exist fails the
// whole call, as EC2's does.
func (s *Server) changeIngress(f url.Values, add bool) (any, *Error) {
	g, ok := s.groups[f.Get("GroupId")]
	if !ok {
		return nil, &Error{Status: 400, Code: "InvalidGroup.NotFound", Message: fmt.Sprintf("The security group '%s' does not exist", f.Get("GroupId"))}
	}
	perms := clonePerms(g.Ingress)
	for i := 1; ; i++ {
		p := fmt.Sprintf("IpPermissions.%d.", i)
		proto := f.Get(p + "IpProtocol")
		if proto == "" {
			break
		}
		from, _ := strconv.Atoi(f.Get(p + "FromPort"))
		to, _ := strconv.Atoi(f.Get(p + "ToPort"))
		var ranges []string
		for j := 1; ; j++ {
			c := f.Get(fmt.Sprintf("%sIpRanges.%d.CidrIp", p, j))
			if c == "" {
				break
			}
			ranges = append(ranges, c)
		}
		for j := 1; ; j++ {
			c := f.Get(fmt.Sprintf("%sIpv6Ranges.%d.CidrIpv6", p, j))
			if c == "" {
				break
			}
			ranges = append(ranges, c)
		}
		for _, c := range ranges {
			idx := slices.IndexFunc(perms, func(q Permission) bool { return q.Protocol == proto && q.FromPort == from && q.ToPort == to })
			if add {
				if idx < 0 {
					perms = append(perms, Permission{Protocol: proto, FromPort: from, ToPort: to})
					idx = len(perms) - 1
				}
				q := &perms[idx]
				list := &q.CIDRs
				if strings.Contains(c, ":") {
					list = &q.IPv6CIDRs
				}
				if slices.Contains(*list, c) {
					return nil, &Error{Status: 400, Code: "InvalidPermission.Duplicate", Message: fmt.Sprintf("the specified rule \"peer: %s, TCP, from port: %d, to port: %d, ALLOW\" already exists", c, from, to)}
				}
				*list = append(*list, c)
				continue
			}
			found := false
			if idx >= 0 {
				q := &perms[idx]
				for _, list := range []*[]string{&q.CIDRs, &q.IPv6CIDRs} {
					if k := slices.Index(*list, c); k >= 0 {
						*list = slices.Delete(*list, k, k+1)
						found = true
					}
				}
				if len(q.CIDRs)+len(q.IPv6CIDRs)+len(q.Groups) == 0 {
					perms = slices.Delete(perms, idx, idx+1)
				}
			}
			if !found {
				return nil, &Error{Status: 400, Code: "InvalidPermission.NotFound", Message: "The specified rule does not exist in this security group."}
			}
		}
	}
	g.Ingress = perms
	return returnResponse{XMLName: xml.Name{Local: map[bool]string{true: "AuthorizeSecurityGroupIngressResponse", false: "RevokeSecurityGroupIngressResponse"}[add]},
		Xmlns: xmlns, RequestID: s.requestID(), Return: true}, nil
}

// indexed returns the values of prefix.1, prefix.2, ... up to the first gap.
