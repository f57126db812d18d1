package aws

import (
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strconv"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
)

// Tags on every instance (and its volume and network interface) this
// provider creates.
const (
	// TagManagedBy with value ManagedBy marks an instance as proxyfleet's;
	// ListByTag filters on it and Get treats instances without it as absent.
	TagManagedBy = "proxyfleet.io/managed-by"
	// ManagedBy is TagManagedBy's value.
	ManagedBy = "proxyfleet"
	// TagOwnerUID carries the owning Proxy's UID: the orphan GC's proof of
	// ownership.
	TagOwnerUID = "proxyfleet.io/proxy-uid"
	// TagInstallation carries the creating controller's installation ID:
	// the orphan GC deletes only its own installation's instances, so two
	// clusters may share an account.
	TagInstallation = "proxyfleet.io/installation"
	// TagOwner carries the owning Proxy's namespace/name, for humans.
	TagOwner = "proxyfleet.io/proxy"
	// TagName is the tag the EC2 console shows as the instance's name; it
	// carries the deterministic instance name.
	TagName = "Name"
	// TagEntry carries the providers config entry on the managed security
	// group.
	TagEntry = "proxyfleet.io/entry"
)

// spec is the pure half of Create: what the request resolves to before
// any call.
type spec struct {
	zone, instanceType, image string
	tags                      map[string]string
	userData                  string // base64, as RunInstances takes it
	port                      int
}

// buildSpec checks req against cfg and resolves its placement, tags and
// user-data, or returns ErrPermanent naming what is wrong. The instance
// type has no built-in default on purpose: inventing one would start a
// billable instance of a shape nobody chose. The image has one
// (DefaultImage), since an AMI ID differs in every region and Debian's
// own name filter is what an operator would pick.
func buildSpec(cfg Config, req providers.CreateRequest) (spec, error) {
	perm := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", providers.ErrPermanent, fmt.Sprintf(format, args...))
	}
	s := spec{
		zone:         firstNonEmpty(req.Placement.Zone, cfg.Defaults.Zone),
		instanceType: firstNonEmpty(req.Placement.MachineType, cfg.Defaults.MachineType),
		image:        firstNonEmpty(req.Placement.Image, cfg.Defaults.Image, DefaultImage),
		port:         req.Port,
	}
	switch {
	case s.zone != "" && (!zonePattern.MatchString(s.zone) || len(s.zone) <= len(cfg.Region) || s.zone[:len(cfg.Region)] != cfg.Region):
		return spec{}, perm("placement.zone %q is not an availability zone of %s (like %sa)", s.zone, cfg.Region, cfg.Region)
	case s.instanceType == "":
		return spec{}, perm("placement.machineType is required: set spec.placement.machineType or the entry's aws.defaults.machineType (an instance type such as t3.micro)")
	case !instanceTypePattern.MatchString(s.instanceType):
		return spec{}, perm("placement.machineType %q is not an instance type (like t3.micro)", s.instanceType)
	case !amiPattern.MatchString(s.image) && !imageNamePattern.MatchString(s.image):
		return spec{}, perm("placement.image %q is neither an AMI ID (ami-...) nor an image name filter", s.image)
	case req.Name == "" || len(req.Name) > 255:
		return spec{}, perm("instance name %q is not usable as a Name tag", req.Name)
	case req.OwnerUID == "" || len(req.OwnerUID) > 55:
		// 55 leaves the ClientToken (at most 64) room for "-" and a counter.
		return spec{}, perm("owner UID %q is not usable as a client token", req.OwnerUID)
	case req.Port < 1 || req.Port > 65535:
		return spec{}, perm("port %d is out of range", req.Port)
	}

	s.tags = map[string]string{}
	for _, src := range []map[string]string{cfg.Tags, req.Labels} {
		for _, k := range slices.Sorted(maps.Keys(src)) {
			if msg := checkTag(k, src[k]); msg != "" {
				return spec{}, perm("tag %s=%q: %s", k, src[k], msg)
			}
			s.tags[k] = src[k]
		}
	}
	for _, k := range []string{TagInstallation, TagOwner} {
		delete(s.tags, k)
	}
	s.tags[TagManagedBy] = ManagedBy
	s.tags[TagOwnerUID] = req.OwnerUID
	s.tags[TagName] = req.Name
	if req.Installation != "" {
		s.tags[TagInstallation] = req.Installation
	}
	if req.OwnerName != "" {
		s.tags[TagOwner] = req.OwnerNamespace + "/" + req.OwnerName
	}

	userData := req.CloudInit
	if len(userData) == 0 {
		if req.ProxyAuth == nil || req.ProxyAuth.Username == "" || req.ProxyAuth.Password == "" {
			return spec{}, perm("the proxyfleet bootstrap needs proxy credentials and none were given (refusing to boot an open proxy)")
		}
		ud, err := bootstrap.Squid(req.Name, req.Port, *req.ProxyAuth)
		if err != nil {
			return spec{}, perm("building the bootstrap cloud-init: %v", err)
		}
		userData = ud
	}
	s.userData = base64.StdEncoding.EncodeToString(userData)
	// EC2 refuses user-data over 16 KiB before encoding.
	if len(userData) > 16<<10 {
		return spec{}, perm("the user-data is %d bytes; EC2 takes at most 16384", len(userData))
	}
	return s, nil
}

// runInput is the RunInstances request of s: one instance, the given
// image (its root volume deleted with it) and security groups, on one network interface with a
// public address unless the entry asks for the private one, tagged with
// its volume and interface, the token making it idempotent.
func runInput(cfg Config, s spec, img image, groups []string, token string) *ec2.RunInstancesInput {
	nic := types.InstanceNetworkInterfaceSpecification{
		DeviceIndex:         awssdk.Int32(0),
		DeleteOnTermination: awssdk.Bool(true),
		Groups:              groups,
	}
	if cfg.SubnetID != "" {
		nic.SubnetId = awssdk.String(cfg.SubnetID)
	}
	if cfg.AddressType == AddressPublic {
		nic.AssociatePublicIpAddress = awssdk.Bool(true)
	}
	if cfg.IPv6 {
		nic.Ipv6AddressCount = awssdk.Int32(1)
	}
	in := &ec2.RunInstancesInput{
		MinCount:          awssdk.Int32(1),
		MaxCount:          awssdk.Int32(1),
		ImageId:           awssdk.String(img.id),
		InstanceType:      types.InstanceType(s.instanceType),
		ClientToken:       awssdk.String(token),
		UserData:          awssdk.String(s.userData),
		NetworkInterfaces: []types.InstanceNetworkInterfaceSpecification{nic},
		// The Squid needs no AWS API: the instance metadata service
		// answers only with a session token (IMDSv2), which a request
		// relayed through the proxy cannot obtain.
		MetadataOptions: &types.InstanceMetadataOptionsRequest{HttpTokens: types.HttpTokensStateRequired},
		// A shutdown from inside the guest ends the instance, so nothing
		// stopped keeps its volume billing.
		InstanceInitiatedShutdownBehavior: types.ShutdownBehaviorTerminate,
	}
	if img.rootDevice != "" {
		// The root volume goes with the instance whatever the AMI's own
		// mapping says: a volume left behind would bill on unseen.
		in.BlockDeviceMappings = []types.BlockDeviceMapping{{DeviceName: awssdk.String(img.rootDevice), Ebs: &types.EbsBlockDevice{DeleteOnTermination: awssdk.Bool(true)}}}
	}
	if s.zone != "" {
		in.Placement = &types.Placement{AvailabilityZone: awssdk.String(s.zone)}
	}
	for _, rt := range []types.ResourceType{types.ResourceTypeInstance, types.ResourceTypeVolume, types.ResourceTypeNetworkInterface} {
		in.TagSpecifications = append(in.TagSpecifications, types.TagSpecification{ResourceType: rt, Tags: tagList(s.tags)})
	}
	return in
}

// clientToken is the k-th RunInstances client token of a Proxy: its UID
// for the first instance, then the UID and a counter for each instance
// that replaces a terminated one (EC2 keeps answering a token with the
// instance it made, and once that is terminated only with
// IdempotentInstanceTerminated).
func clientToken(uid string, k int) string {
	if k == 0 {
		return uid
	}
	return uid + "-" + strconv.Itoa(k)
}

func tagList(m map[string]string) []types.Tag {
	out := make([]types.Tag, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, types.Tag{Key: awssdk.String(k), Value: awssdk.String(m[k])})
	}
	return out
}

func tagMap(tags []types.Tag) map[string]string {
	out := make(map[string]string, len(tags))
	for _, t := range tags {
		out[awssdk.ToString(t.Key)] = awssdk.ToString(t.Value)
	}
	return out
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
