package ec2api

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

func (s *Server) runInstances(f url.Values) (any, *Error) {
	token := f.Get("ClientToken")
	if id, ok := s.tokens[token]; ok && token != "" {
		in := s.instances[id]
		if s.launched[token] != f.Get("ImageId")+" "+f.Get("InstanceType") {
			return nil, &Error{Status: 400, Code: "IdempotentParameterMismatch", Message: "The client token you have provided is associated with a resource that is already deleted or with different parameters"}
		}
		if in == nil || in.State == StateTerminated {
			return nil, &Error{Status: 400, Code: "IdempotentInstanceTerminated", Message: "The client token you provided is associated with a resource that is already deleted. Please use a different client token."}
		}
		return s.reservation(in), nil
	}
	if f.Get("MinCount") != "1" || f.Get("MaxCount") != "1" {
		return nil, badParam("proxyfleet's stand-in launches exactly one instance (MinCount %q, MaxCount %q)", f.Get("MinCount"), f.Get("MaxCount"))
	}
	image := f.Get("ImageId")
	if !s.imageExists(image) {
		return nil, &Error{Status: 400, Code: "InvalidAMIID.NotFound", Message: fmt.Sprintf("The image id '[%s]' does not exist", image)}
	}
	typ := f.Get("InstanceType")
	if typ == "" || !strings.Contains(typ, ".") {
		return nil, badParam("Invalid value '%s' for InstanceType.", typ)
	}
	in := &Instance{ID: s.newID("i-"), Type: typ, ImageID: image, State: StatePending,
		Zone: f.Get("Placement.AvailabilityZone"), ClientToken: token, LaunchTime: time.Now().UTC(),
		VpcID: s.vpc, Tags: map[string]string{}}
	if in.Zone == "" {
		in.Zone = s.Region + "a"
	}
	if ud := f.Get("UserData"); ud != "" {
		b, err := base64.StdEncoding.DecodeString(ud)
		if err != nil {
			return nil, badParam("Invalid BASE64 encoding of user data.")
		}
		in.UserData = string(b)
	}
	in.RootDevice, in.RootDeleteOnTermination = f.Get("BlockDeviceMapping.1.DeviceName"), f.Get("BlockDeviceMapping.1.Ebs.DeleteOnTermination")
	in.SubnetID = f.Get("NetworkInterface.1.SubnetId")
	in.AssociatePublicIP = f.Get("NetworkInterface.1.AssociatePublicIpAddress")
	in.IPv6AddressCount, _ = strconv.Atoi(f.Get("NetworkInterface.1.Ipv6AddressCount"))
	in.SecurityGroups = indexed(f, "NetworkInterface.1.SecurityGroupId")
	if f.Get("SubnetId") != "" || len(indexed(f, "SecurityGroupId")) > 0 {
		if f.Get("NetworkInterface.1.DeviceIndex") != "" {
			return nil, &Error{Status: 400, Code: "InvalidParameterCombination", Message: "Network interfaces and an instance-level security groups may not be specified on the same request"}
		}
		in.SubnetID, in.SecurityGroups = f.Get("SubnetId"), indexed(f, "SecurityGroupId")
	}
	for _, g := range in.SecurityGroups {
		if _, ok := s.groups[g]; !ok {
			return nil, &Error{Status: 400, Code: "InvalidGroup.NotFound", Message: fmt.Sprintf("The security group '%s' does not exist", g)}
		}
	}
	for i := 1; ; i++ {
		p := fmt.Sprintf("TagSpecification.%d.", i)
		rt := f.Get(p + "ResourceType")
		if rt == "" {
			break
		}
		tags := tagsOf(f, p+"Tag")
		switch rt {
		case "instance":
			in.Tags = tags
		case "volume":
			in.VolumeTags = tags
		case "network-interface":
			in.NICTags = tags
		default:
			return nil, badParam("'%s' is not a valid taggable resource type for this operation.", rt)
		}
	}
	if s.bootIP != "" {
		in.State, in.PublicIP, in.PrivateIP = StateRunning, s.bootIP, fmt.Sprintf("10.0.0.%d", 1+s.seq%250)
	}
	s.instances[in.ID] = in
	if token != "" {
		s.tokens[token] = in.ID
		s.launched[token] = f.Get("ImageId") + " " + f.Get("InstanceType")
	}
	return s.reservation(in), nil
}

func (s *Server) imageExists(id string) bool {
	for _, img := range s.images {
		if img.ID == id {
			return true
		}
	}
	return false
}

func (s *Server) reservation(in *Instance) runInstancesResponse {
	return runInstancesResponse{Xmlns: xmlns, RequestID: s.requestID(), ReservationID: "r-" + strings.TrimPrefix(in.ID, "i-"),
		OwnerID: "123456789012", Instances: []instanceXML{instanceOf(in)}}
}

func (s *Server) requestID() string {
	s.seq++
	return fmt.Sprintf("7e1d4c1e-0000-4000-8000-%012d", s.seq)
}

func (s *Server) describeInstances(f url.Values) (any, *Error) {
	ids := indexed(f, "InstanceId")
	for _, id := range ids {
		if !strings.HasPrefix(id, "i-") {
			return nil, &Error{Status: 400, Code: "InvalidInstanceID.Malformed", Message: fmt.Sprintf("Invalid id: \"%s\"", id)}
		}
		if _, ok := s.instances[id]; !ok {
			return nil, &Error{Status: 400, Code: "InvalidInstanceID.NotFound", Message: fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
	}
	filters, e := filtersOf(f)
	if e != nil {
		return nil, e
	}
	var matched []*Instance
	for _, in := range s.instances {
		if len(ids) > 0 && !slices.Contains(ids, in.ID) {
			continue
		}
		if in.matches(filters) {
			matched = append(matched, in)
		}
	}
	sort.Slice(matched, func(i, j int) bool { return matched[i].ID < matched[j].ID })
	size := s.pageSize
	if m, err := strconv.Atoi(f.Get("MaxResults")); err == nil {
		if len(ids) > 0 {
			return nil, &Error{Status: 400, Code: "InvalidParameterCombination", Message: "The parameter instancesSet cannot be used with the parameter maxResults"}
		}
		if m < 5 || m > 1000 {
			return nil, badParam("Value ( %d ) for parameter maxResults is invalid. Expecting a value greater than 5.", m)
		}
		size = min(size, m)
	}
	start := 0
	if tok := f.Get("NextToken"); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "page-"))
		if err != nil || n < 0 || n > len(matched) {
			return nil, badParam("Invalid value for NextToken")
		}
		start = n
	}
	end := min(start+size, len(matched))
	resp := describeInstancesResponse{Xmlns: xmlns, RequestID: s.requestID()}
	for _, in := range matched[start:end] {
		resp.Reservations = append(resp.Reservations, reservationXML{ReservationID: "r-" + strings.TrimPrefix(in.ID, "i-"), OwnerID: "123456789012", Instances: []instanceXML{instanceOf(in)}})
	}
	if end < len(matched) {
		resp.NextToken = "page-" + strconv.Itoa(end)
	}
	// EC2 finishes a termination after it was seen shutting down. Only
	// a describe by ID moves it on, so a paginated list stays stable.
	for _, in := range matched[start:end] {
		if len(ids) == 0 {
			break
		}
		if in.State == StateShuttingDown {
			in.State = StateTerminated
		}
	}
	return resp, nil
}

// matches reports whether in passes every filter: tag:KEY, tag-key,
// instance-state-name, client-token and availability-zone.
func (in *Instance) matches(filters map[string][]string) bool {
	for name, values := range filters {
		var have []string
		switch {
		case strings.HasPrefix(name, "tag:"):
			if v, ok := in.Tags[strings.TrimPrefix(name, "tag:")]; ok {
				have = []string{v}
			}
		case name == "tag-key":
			for k := range in.Tags {
				have = append(have, k)
			}
		case name == "instance-state-name":
			have = []string{in.State}
		case name == "client-token":
			have = []string{in.ClientToken}
		case name == "availability-zone":
			have = []string{in.Zone}
		default:
			return false
		}
		if !slices.ContainsFunc(have, func(h string) bool { return matchAny(values, h) }) {
			return false
		}
	}
	return true
}

// matchAny reports whether v matches one of patterns, where * matches any run.
func matchAny(patterns []string, v string) bool {
	for _, p := range patterns {
		if wildcard(p, v) {
			return true
		}
	}
	return false
}

func wildcard(p, v string) bool {
	parts := strings.Split(p, "*")
	if len(parts) == 1 {
		return p == v
	}
	if !strings.HasPrefix(v, parts[0]) {
		return false
	}
	v = v[len(parts[0]):]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(v, mid)
		if i < 0 {
			return false
		}
		v = v[i+len(mid):]
	}
	return strings.HasSuffix(v, parts[len(parts)-1])
}

var knownFilters = []string{"instance-state-name", "client-token", "availability-zone", "tag-key", "name", "state", "architecture", "owner-id", "group-name", "vpc-id", "group-id"}

func filtersOf(f url.Values) (map[string][]string, *Error) {
	out := map[string][]string{}
	for i := 1; ; i++ {
		p := fmt.Sprintf("Filter.%d.", i)
		name := f.Get(p + "Name")
		if name == "" {
			return out, nil
		}
		if !strings.HasPrefix(name, "tag:") && !slices.Contains(knownFilters, name) {
			return nil, &Error{Status: 400, Code: "InvalidParameterValue", Message: fmt.Sprintf("The filter '%s' is invalid", name)}
		}
		out[name] = indexed(f, p+"Value")
	}
}

func (s *Server) terminateInstances(f url.Values) (any, *Error) {
	ids := indexed(f, "InstanceId")
	if len(ids) == 0 {
		return nil, &Error{Status: 400, Code: "MissingParameter", Message: "The request must contain the parameter InstanceId"}
	}
	resp := terminateInstancesResponse{Xmlns: xmlns, RequestID: s.requestID()}
	for _, id := range ids {
		in, ok := s.instances[id]
		if !ok {
			return nil, &Error{Status: 400, Code: "InvalidInstanceID.NotFound", Message: fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
		prev := in.State
		if in.State != StateTerminated {
			in.State = StateShuttingDown
		}
		resp.Changes = append(resp.Changes, stateChangeXML{InstanceID: id, Current: stateXML{Code: stateCodes[in.State], Name: in.State}, Previous: stateXML{Code: stateCodes[prev], Name: prev}})
	}
	return resp, nil
}

func indexed(f url.Values, prefix string) []string {
	var out []string
	for i := 1; ; i++ {
		v, ok := f[prefix+"."+strconv.Itoa(i)]
		if !ok {
			return out
		}
		out = append(out, v[0])
	}
}

func tagsOf(f url.Values, prefix string) map[string]string {
	out := map[string]string{}
	for i := 1; ; i++ {
		p := prefix + "." + strconv.Itoa(i) + "."
		k, ok := f[p+"Key"]
		if !ok {
			return out
		}
		out[k[0]] = f.Get(p + "Value")
	}
}
