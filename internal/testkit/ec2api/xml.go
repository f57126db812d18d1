package ec2api

import (
	"encoding/xml"
	"sort"
	"strings"
)

// The XML shapes of EC2's answers, as the SDK's deserializers read them.

type stateXML struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type tagXML struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type groupRefXML struct {
	ID string `xml:"groupId"`
}

type ipv6XML struct {
	Address string `xml:"ipv6Address"`
}

type nicXML struct {
	ID        string    `xml:"networkInterfaceId"`
	SubnetID  string    `xml:"subnetId,omitempty"`
	VpcID     string    `xml:"vpcId,omitempty"`
	PrivateIP string    `xml:"privateIpAddress,omitempty"`
	IPv6      []ipv6XML `xml:"ipv6AddressesSet>item"`
}

type instanceXML struct {
	ID          string        `xml:"instanceId"`
	ImageID     string        `xml:"imageId"`
	State       stateXML      `xml:"instanceState"`
	Type        string        `xml:"instanceType"`
	LaunchTime  string        `xml:"launchTime"`
	Zone        string        `xml:"placement>availabilityZone"`
	SubnetID    string        `xml:"subnetId,omitempty"`
	VpcID       string        `xml:"vpcId,omitempty"`
	PrivateIP   string        `xml:"privateIpAddress,omitempty"`
	PublicIP    string        `xml:"ipAddress,omitempty"`
	IPv6        string        `xml:"ipv6Address,omitempty"`
	ClientToken string        `xml:"clientToken,omitempty"`
	Groups      []groupRefXML `xml:"groupSet>item"`
	Tags        []tagXML      `xml:"tagSet>item"`
	NICs        []nicXML      `xml:"networkInterfaceSet>item"`
}

func instanceOf(in *Instance) instanceXML {
	x := instanceXML{ID: in.ID, ImageID: in.ImageID, State: stateXML{Code: stateCodes[in.State], Name: in.State},
		Type: in.Type, LaunchTime: in.LaunchTime.Format("2006-01-02T15:04:05.000Z"), Zone: in.Zone,
		SubnetID: in.SubnetID, VpcID: in.VpcID, PrivateIP: in.PrivateIP, PublicIP: in.PublicIP, IPv6: in.IPv6, ClientToken: in.ClientToken}
	for _, g := range in.SecurityGroups {
		x.Groups = append(x.Groups, groupRefXML{ID: g})
	}
	keys := make([]string, 0, len(in.Tags))
	for k := range in.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		x.Tags = append(x.Tags, tagXML{Key: k, Value: in.Tags[k]})
	}
	if in.State != StateTerminated {
		nic := nicXML{ID: "eni-" + strings.TrimPrefix(in.ID, "i-"), SubnetID: in.SubnetID, VpcID: in.VpcID, PrivateIP: in.PrivateIP}
		if in.IPv6 != "" {
			nic.IPv6 = []ipv6XML{{Address: in.IPv6}}
		}
		x.NICs = []nicXML{nic}
	}
	return x
}

type reservationXML struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type runInstancesResponse struct {
	XMLName       xml.Name      `xml:"RunInstancesResponse"`
	Xmlns         string        `xml:"xmlns,attr"`
	RequestID     string        `xml:"requestId"`
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type describeInstancesResponse struct {
	XMLName      xml.Name         `xml:"DescribeInstancesResponse"`
	Xmlns        string           `xml:"xmlns,attr"`
	RequestID    string           `xml:"requestId"`
	Reservations []reservationXML `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type stateChangeXML struct {
	InstanceID string   `xml:"instanceId"`
	Current    stateXML `xml:"currentState"`
	Previous   stateXML `xml:"previousState"`
}

type terminateInstancesResponse struct {
	XMLName   xml.Name         `xml:"TerminateInstancesResponse"`
	Xmlns     string           `xml:"xmlns,attr"`
	RequestID string           `xml:"requestId"`
	Changes   []stateChangeXML `xml:"instancesSet>item"`
}

type imageXML struct {
	ID           string `xml:"imageId"`
	Name         string `xml:"name"`
	Owner        string `xml:"imageOwnerId"`
	State        string `xml:"imageState"`
	Architecture string `xml:"architecture"`
	Created      string `xml:"creationDate"`
	RootDevice   string `xml:"rootDeviceName"`
}

type describeImagesResponse struct {
	XMLName   xml.Name   `xml:"DescribeImagesResponse"`
	Xmlns     string     `xml:"xmlns,attr"`
	RequestID string     `xml:"requestId"`
	Images    []imageXML `xml:"imagesSet>item"`
}

type cidrXML struct {
	CIDR string `xml:"cidrIp"`
}

type cidr6XML struct {
	CIDR string `xml:"cidrIpv6"`
}

type userGroupXML struct {
	ID string `xml:"groupId"`
}

type permissionXML struct {
	Protocol string         `xml:"ipProtocol"`
	FromPort int            `xml:"fromPort"`
	ToPort   int            `xml:"toPort"`
	Ranges   []cidrXML      `xml:"ipRanges>item"`
	Ranges6  []cidr6XML     `xml:"ipv6Ranges>item"`
	Groups   []userGroupXML `xml:"groups>item"`
}

type securityGroupXML struct {
	ID          string          `xml:"groupId"`
	Name        string          `xml:"groupName"`
	Description string          `xml:"groupDescription"`
	VpcID       string          `xml:"vpcId"`
	OwnerID     string          `xml:"ownerId"`
	Ingress     []permissionXML `xml:"ipPermissions>item"`
	Egress      []permissionXML `xml:"ipPermissionsEgress>item"`
	Tags        []tagXML        `xml:"tagSet>item"`
}

func groupOf(g *SecurityGroup) securityGroupXML {
	x := securityGroupXML{ID: g.ID, Name: g.Name, Description: g.Description, VpcID: g.VpcID, OwnerID: "123456789012",
		Egress: []permissionXML{{Protocol: "-1", Ranges: []cidrXML{{CIDR: "0.0.0.0/0"}}}}}
	for _, p := range g.Ingress {
		px := permissionXML{Protocol: p.Protocol, FromPort: p.FromPort, ToPort: p.ToPort}
		for _, c := range p.CIDRs {
			px.Ranges = append(px.Ranges, cidrXML{CIDR: c})
		}
		for _, c := range p.IPv6CIDRs {
			px.Ranges6 = append(px.Ranges6, cidr6XML{CIDR: c})
		}
		for _, id := range p.Groups {
			px.Groups = append(px.Groups, userGroupXML{ID: id})
		}
		x.Ingress = append(x.Ingress, px)
	}
	keys := make([]string, 0, len(g.Tags))
	for k := range g.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		x.Tags = append(x.Tags, tagXML{Key: k, Value: g.Tags[k]})
	}
	return x
}

type describeSecurityGroupsResponse struct {
	XMLName   xml.Name           `xml:"DescribeSecurityGroupsResponse"`
	Xmlns     string             `xml:"xmlns,attr"`
	RequestID string             `xml:"requestId"`
	Groups    []securityGroupXML `xml:"securityGroupInfo>item"`
}

type createSecurityGroupResponse struct {
	XMLName   xml.Name `xml:"CreateSecurityGroupResponse"`
	Xmlns     string   `xml:"xmlns,attr"`
	RequestID string   `xml:"requestId"`
	GroupID   string   `xml:"groupId"`
}

type returnResponse struct {
	XMLName   xml.Name
	Xmlns     string `xml:"xmlns,attr"`
	RequestID string `xml:"requestId"`
	Return    bool   `xml:"return"`
}
