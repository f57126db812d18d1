package aws

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/proxyfleet/proxyfleet/providers"
)

// Type is this provider's type in the providers config file, and the key of
// its block.
const Type = "aws"

// Address types: which of the instance's addresses becomes status.ip.
const (
	// AddressPublic is the public IPv4 address, or the first IPv6 address
	// when the instance has no public IPv4 (an IPv6-only subnet).
	AddressPublic = "public"
	// AddressPrivate is the private IPv4 address, for clusters in the VPC.
	AddressPrivate = "private"
)

// DebianOwner is the AWS account Debian publishes its official AMIs from,
// the default owner a name filter is looked up under.
const DebianOwner = "136693071363"

// DefaultImage is the image name filter used when neither the Proxy nor the
// entry names an image: Debian 12 for x86-64 from DebianOwner, the newest
// available. Debian 12 because the bootstrap's login file holds a bcrypt
// hash that Debian 12's crypt(3) checks (docs/providers/gcp.md).
const DefaultImage = "debian-12-amd64-*"

// Config configures one aws provider entry: EC2 instances in one region. It
// is the aws block of the providers config file as written (ReadConfig
// decodes and validates it); New takes it from code.
type Config struct {
	// Region is the EC2 region, such as eu-west-1 (required).
	Region string `json:"region"`
	// Defaults fill Proxy placement fields left empty: zone is an
	// availability zone (empty lets EC2 pick one, or the subnet's),
	// machineType an instance type, image an AMI ID or an image name
	// filter (DefaultImage when empty).
	Defaults providers.Placement `json:"defaults,omitempty"`
	// ImageOwners are the accounts (IDs, or aliases such as amazon) an
	// image name filter is looked up under; [DebianOwner] when empty. An
	// AMI ID is used as given.
	ImageOwners []string `json:"imageOwners,omitempty"`
	// SubnetID places every instance; empty means the default subnet of
	// the default VPC in the instance's zone.
	SubnetID string `json:"subnetID,omitempty"`
	// VpcID is the VPC of SubnetID, where the provider keeps its security
	// group; required with subnetID, empty means the default VPC.
	VpcID string `json:"vpcID,omitempty"`
	// SourceRanges are the CIDRs (IPv4 or IPv6) the proxy port is opened
	// to: the gateways' egress addresses. The provider keeps one security
	// group per entry and installation admitting them on each Proxy's port
	// and nothing else. Required unless SecurityGroupIDs is given.
	SourceRanges []string `json:"sourceRanges,omitempty"`
	// SSHSourceRanges, when given, also open port 22 to these CIDRs; SSH
	// is closed by default.
	SSHSourceRanges []string `json:"sshSourceRanges,omitempty"`
	// SecurityGroupIDs replace the managed security group with groups the
	// operator keeps: the provider attaches them and never changes them.
	SecurityGroupIDs []string `json:"securityGroupIDs,omitempty"`
	// AddressType picks the address that becomes status.ip: AddressPublic
	// (the default) or AddressPrivate.
	AddressType string `json:"addressType,omitempty"`
	// IPv6 gives every instance one IPv6 address (the subnet needs an IPv6
	// CIDR).
	IPv6 bool `json:"ipv6,omitempty"`
	// Tags are extra tags on every instance, its volume and its network
	// interface; proxyfleet's own keys win.
	Tags map[string]string `json:"tags,omitempty"`
	// HourlyPrice is what one instance costs an hour in the operator's
	// currency, reported per Proxy for cost accounting; 0 reports nothing.
	HourlyPrice float64 `json:"hourlyPrice,omitempty"`

	// Credentials names files holding a static access key (a mounted
	// Secret), read again on every request so a rotated Secret needs no
	// restart; nil means the ambient chain (IRSA, the instance role, the
	// environment).
	Credentials *Credentials `json:"credentials,omitempty"`
	// Endpoint is the EC2 API base URL; empty means the region's. For
	// private endpoints and stand-ins.
	Endpoint string `json:"endpoint,omitempty"`
	// NoAuth signs nothing: only for stand-ins that check no signature.
	NoAuth bool `json:"noAuth,omitempty"`

	// Entry is the entry's name (not read from the block): the managed
	// security group is named after it.
	Entry string `json:"-"`
}

// Credentials are the files of a static access key.
type Credentials struct {
	// AccessKeyIDFile and SecretAccessKeyFile are absolute paths (required).
	AccessKeyIDFile     string `json:"accessKeyIDFile"`
	SecretAccessKeyFile string `json:"secretAccessKeyFile"`
	// SessionTokenFile is optional, for temporary keys.
	SessionTokenFile string `json:"sessionTokenFile,omitempty"`
}

// ReadConfig reads and validates e's aws block, with AddressType defaulted
// and Entry set. Every problem is reported (providers.Problems), each
// naming its field ("aws.region is required").
func ReadConfig(e providers.Entry) (Config, error) {
	var cfg Config
	if err := e.Decode(Type, &cfg); err != nil {
		return Config{}, err
	}
	cfg.Entry = e.Name
	if err := providers.Problems(append(cfg.validatePlacement(), cfg.validateAccess()...)); err != nil {
		return Config{}, err
	}
	if cfg.AddressType == "" {
		cfg.AddressType = AddressPublic
	}
	return cfg, nil
}

var (
	// regionPattern is an AWS region name (eu-west-1, us-gov-west-1).
	regionPattern = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$`)
	// zonePattern is an availability zone name (eu-west-1a) or a local
	// zone (us-west-2-lax-1a).
	zonePattern = regexp.MustCompile(`^[a-z]{2}(-[a-z0-9]+)+[a-z]$`)
	// instanceTypePattern is an instance type (t3.micro, c7gn.medium).
	instanceTypePattern = regexp.MustCompile(`^[a-z][a-z0-9-]*\.[a-z0-9]+$`)
	amiPattern          = regexp.MustCompile(`^ami-[0-9a-f]{8,17}$`)
	subnetPattern       = regexp.MustCompile(`^subnet-[0-9a-f]{8,17}$`)
	vpcPattern          = regexp.MustCompile(`^vpc-[0-9a-f]{8,17}$`)
	groupPattern        = regexp.MustCompile(`^sg-[0-9a-f]{8,17}$`)
	ownerPattern        = regexp.MustCompile(`^([0-9]{12}|self|amazon|aws-marketplace)$`)
	// imageNamePattern is what a name filter may hold: AMI name characters
	// and the wildcards * and ?.
	imageNamePattern = regexp.MustCompile(`^[A-Za-z0-9()\[\]./'@_*?-]{1,128}$`)
)

// validatePlacement checks the region and where instances go.
func (c *Config) validatePlacement() []string {
	var out []string
	switch {
	case c.Region == "":
		out = append(out, "aws.region is required")
	case !regionPattern.MatchString(c.Region):
		out = append(out, fmt.Sprintf("aws.region %q is not a region (like eu-west-1)", c.Region))
	}
	if z := c.Defaults.Zone; z != "" && (!zonePattern.MatchString(z) || !strings.HasPrefix(z, c.Region)) {
		out = append(out, fmt.Sprintf("aws.defaults.zone %q is not an availability zone of %s (like %sa)", z, c.Region, c.Region))
	}
	if m := c.Defaults.MachineType; m != "" && !instanceTypePattern.MatchString(m) {
		out = append(out, fmt.Sprintf("aws.defaults.machineType %q is not an instance type (like t3.micro)", m))
	}
	if img := c.Defaults.Image; img != "" && !amiPattern.MatchString(img) && !imageNamePattern.MatchString(img) {
		out = append(out, fmt.Sprintf("aws.defaults.image %q is neither an AMI ID (ami-...) nor an image name filter", img))
	}
	for i, o := range c.ImageOwners {
		if !ownerPattern.MatchString(o) {
			out = append(out, fmt.Sprintf("aws.imageOwners[%d] %q is not an account ID (12 digits), self, amazon or aws-marketplace", i, o))
		}
	}
	if s := c.SubnetID; s != "" && !subnetPattern.MatchString(s) {
		out = append(out, fmt.Sprintf("aws.subnetID %q is not a subnet ID (subnet-...)", s))
	}
	if v := c.VpcID; v != "" && !vpcPattern.MatchString(v) {
		out = append(out, fmt.Sprintf("aws.vpcID %q is not a VPC ID (vpc-...)", v))
	}
	if c.SubnetID != "" && c.VpcID == "" && len(c.SecurityGroupIDs) == 0 {
		out = append(out, "aws.vpcID is required with aws.subnetID: the managed security group must be made in the subnet's VPC")
	}
	switch c.AddressType {
	case "", AddressPublic, AddressPrivate:
	default:
		out = append(out, fmt.Sprintf("aws.addressType %q is not public or private", c.AddressType))
	}
	if c.HourlyPrice < 0 {
		out = append(out, fmt.Sprintf("aws.hourlyPrice %v is negative", c.HourlyPrice))
	}
	return out
}

// validateAccess checks who may reach the instances, what they carry and
// how the client logs in.
func (c *Config) validateAccess() []string {
	var out []string
	switch {
	case len(c.SecurityGroupIDs) > 0 && (len(c.SourceRanges) > 0 || len(c.SSHSourceRanges) > 0):
		out = append(out, "aws.securityGroupIDs and aws.sourceRanges/sshSourceRanges are mutually exclusive: either the provider keeps the security group or you do")
	case len(c.SecurityGroupIDs) == 0 && len(c.SourceRanges) == 0:
		out = append(out, "aws.sourceRanges is required (the gateways' egress CIDRs the proxy port is opened to), or name your own aws.securityGroupIDs")
	}
	// In the order of the file, so the same mistakes read the same way each time.
	_, bad := providers.ParseCIDRs("aws.sourceRanges", c.SourceRanges)
	out = append(out, bad...)
	_, bad = providers.ParseCIDRs("aws.sshSourceRanges", c.SSHSourceRanges)
	out = append(out, bad...)
	for i, g := range c.SecurityGroupIDs {
		if !groupPattern.MatchString(g) {
			out = append(out, fmt.Sprintf("aws.securityGroupIDs[%d] %q is not a security group ID (sg-...)", i, g))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(c.Tags)) {
		if msg := checkTag(k, c.Tags[k]); msg != "" {
			out = append(out, fmt.Sprintf("aws.tags[%s]: %s", k, msg))
		}
	}
	if cr := c.Credentials; cr != nil {
		for field, f := range map[string]string{"accessKeyIDFile": cr.AccessKeyIDFile, "secretAccessKeyFile": cr.SecretAccessKeyFile, "sessionTokenFile": cr.SessionTokenFile} {
			switch {
			case f == "" && field != "sessionTokenFile":
				out = append(out, "aws.credentials."+field+" is required")
			case f != "" && !strings.HasPrefix(f, "/"):
				out = append(out, fmt.Sprintf("aws.credentials.%s %q must be an absolute path", field, f))
			}
		}
		if c.NoAuth {
			out = append(out, "aws.noAuth and aws.credentials are mutually exclusive")
		}
	}
	if e := c.Endpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			out = append(out, "aws.endpoint is not an http(s) base URL without credentials")
		}
	}
	return out
}

// checkTag is EC2's tag syntax: a key of 1-128 and a value of at most 256
// characters, the key not starting with aws: (reserved by AWS).
func checkTag(k, v string) string {
	switch {
	case k == "" || len(k) > 128:
		return "the key must be 1-128 characters"
	case strings.HasPrefix(strings.ToLower(k), "aws:"):
		return "keys starting with aws: are reserved by AWS"
	case len(v) > 256:
		return "the value is longer than 256 characters"
	}
	return ""
}
