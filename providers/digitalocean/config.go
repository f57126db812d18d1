package digitalocean

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/proxyfleet/proxyfleet/providers"
)

// Type is this provider's type in the providers config file, and the key of
// its block.
const Type = "digitalocean"

// Address types: which of the droplet's addresses becomes status.ip.
const (
	// AddressPublic is the public IPv4 address, or the public IPv6
	// address when the droplet has no public IPv4.
	AddressPublic = "public"
	// AddressPrivate is the VPC address, for clusters in the same VPC.
	AddressPrivate = "private"
)

// DefaultImage is the image slug used when neither the Proxy nor the entry
// names one: DigitalOcean's Debian 12, whose crypt(3) checks the bcrypt
// hash of the bootstrap's login file (docs/providers/gcp.md).
const DefaultImage = "debian-12-x64"

// Config configures one digitalocean provider entry: droplets in one
// region. It is the digitalocean block of the providers config file as
// written (ReadConfig decodes and validates it); New takes it from code.
type Config struct {
	// Region is the region slug droplets are created in, such as ams3
	// (required); a Proxy's placement.zone may name another.
	Region string `json:"region"`
	// Defaults fill Proxy placement fields left empty: zone is a region
	// slug, machineType a size slug (s-1vcpu-512mb-10gb), image an image
	// slug (DefaultImage when empty).
	Defaults providers.Placement `json:"defaults,omitempty"`
	// SourceRanges are the CIDRs (IPv4 or IPv6) the proxy port is opened
	// to: the gateways' egress addresses (required). The provider keeps
	// one cloud firewall per entry and installation admitting them on
	// each Proxy's port and nothing else.
	SourceRanges []string `json:"sourceRanges"`
	// SSHSourceRanges, when given, also open port 22 to these CIDRs; SSH
	// is closed by default.
	SSHSourceRanges []string `json:"sshSourceRanges,omitempty"`
	// SSHKeys are SSH key IDs or fingerprints of the account put on every
	// droplet; without one DigitalOcean e-mails a root password for each
	// droplet.
	SSHKeys []string `json:"sshKeys,omitempty"`
	// VPCUUID places droplets in that VPC; empty means the region's
	// default VPC.
	VPCUUID string `json:"vpcUUID,omitempty"`
	// AddressType picks the address that becomes status.ip: AddressPublic
	// (the default) or AddressPrivate.
	AddressType string `json:"addressType,omitempty"`
	// IPv6 gives every droplet a public IPv6 address too.
	IPv6 bool `json:"ipv6,omitempty"`
	// Tags are extra tags on every droplet; the proxyfleet prefix is
	// reserved.
	Tags []string `json:"tags,omitempty"`
	// HourlyPrice is what one droplet costs an hour in the operator's
	// currency, reported per Proxy for cost accounting; 0 reports nothing.
	HourlyPrice float64 `json:"hourlyPrice,omitempty"`

	// TokenFile is the absolute path of a file holding the API token (a
	// mounted Secret), read again on every request so a rotated token
	// needs no restart. Required unless NoAuth.
	TokenFile string `json:"tokenFile,omitempty"`
	// Endpoint is the API base URL; empty means DigitalOcean's. For
	// stand-ins.
	Endpoint string `json:"endpoint,omitempty"`
	// NoAuth sends no token: only for stand-ins that check none.
	NoAuth bool `json:"noAuth,omitempty"`

	// Entry is the entry's name (not read from the block): the managed
	// firewall is named after it.
	Entry string `json:"-"`
}

// ReadConfig reads and validates e's digitalocean block, with AddressType
// defaulted and Entry set. Every problem is reported, each naming its field.
func ReadConfig(e providers.Entry) (Config, error) {
	var cfg Config
	if err := e.Decode(Type, &cfg); err != nil {
		return Config{}, err
	}
	cfg.Entry = e.Name
	if err := providers.Problems(cfg.validate()); err != nil {
		return Config{}, err
	}
	if cfg.AddressType == "" {
		cfg.AddressType = AddressPublic
	}
	return cfg, nil
}

var (
	// regionPattern is a region slug (ams3, nyc1, sfo3).
	regionPattern = regexp.MustCompile(`^[a-z]{3}[0-9]$`)
	// sizePattern is a size slug (s-1vcpu-512mb-10gb, c-2, g-2vcpu-8gb).
	sizePattern = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	// imagePattern is an image slug (debian-12-x64, ubuntu-24-04-x64).
	imagePattern = regexp.MustCompile(`^[a-z][a-z0-9.]*(-[a-z0-9.]+)*$`)
	// sshKeyPattern is a key's numeric ID or its MD5 fingerprint.
	sshKeyPattern = regexp.MustCompile(`^([0-9]{1,12}|[0-9a-f]{2}(:[0-9a-f]{2}){15})$`)
	uuidPattern   = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	// tagPattern is DigitalOcean's tag syntax.
	tagPattern = regexp.MustCompile(`^[A-Za-z0-9:_-]{1,255}$`)
)

func (c *Config) validate() []string {
	var out []string
	switch {
	case c.Region == "":
		out = append(out, "digitalocean.region is required")
	case !regionPattern.MatchString(c.Region):
		out = append(out, fmt.Sprintf("digitalocean.region %q is not a region slug (like ams3)", c.Region))
	}
	if z := c.Defaults.Zone; z != "" && !regionPattern.MatchString(z) {
		out = append(out, fmt.Sprintf("digitalocean.defaults.zone %q is not a region slug (like ams3)", z))
	}
	if m := c.Defaults.MachineType; m != "" && !sizePattern.MatchString(m) {
		out = append(out, fmt.Sprintf("digitalocean.defaults.machineType %q is not a size slug (like s-1vcpu-1gb)", m))
	}
	if img := c.Defaults.Image; img != "" && !imagePattern.MatchString(img) {
		out = append(out, fmt.Sprintf("digitalocean.defaults.image %q is not an image slug (like debian-12-x64)", img))
	}
	if len(c.SourceRanges) == 0 {
		out = append(out, "digitalocean.sourceRanges is required (the gateways' egress CIDRs the proxy port is opened to)")
	}
	// In the order of the file, so the same mistakes read the same way each time.
	_, bad := providers.ParseCIDRs("digitalocean.sourceRanges", c.SourceRanges)
	out = append(out, bad...)
	_, bad = providers.ParseCIDRs("digitalocean.sshSourceRanges", c.SSHSourceRanges)
	out = append(out, bad...)
	for i, k := range c.SSHKeys {
		if !sshKeyPattern.MatchString(k) {
			out = append(out, fmt.Sprintf("digitalocean.sshKeys[%d] %q is neither a key ID nor an MD5 fingerprint (aa:bb:...)", i, k))
		}
	}
	if v := c.VPCUUID; v != "" && !uuidPattern.MatchString(v) {
		out = append(out, fmt.Sprintf("digitalocean.vpcUUID %q is not a VPC UUID", v))
	}
	switch c.AddressType {
	case "", AddressPublic, AddressPrivate:
	default:
		out = append(out, fmt.Sprintf("digitalocean.addressType %q is not public or private", c.AddressType))
	}
	for i, t := range c.Tags {
		if msg := checkTag(t); msg != "" {
			out = append(out, fmt.Sprintf("digitalocean.tags[%d] %q: %s", i, t, msg))
		}
	}
	if c.HourlyPrice < 0 {
		out = append(out, fmt.Sprintf("digitalocean.hourlyPrice %v is negative", c.HourlyPrice))
	}
	switch {
	case c.NoAuth && c.TokenFile != "":
		out = append(out, "digitalocean.noAuth and digitalocean.tokenFile are mutually exclusive")
	case !c.NoAuth && c.TokenFile == "":
		out = append(out, "digitalocean.tokenFile is required (the path of the mounted API token)")
	case c.TokenFile != "" && !strings.HasPrefix(c.TokenFile, "/"):
		out = append(out, fmt.Sprintf("digitalocean.tokenFile %q must be an absolute path", c.TokenFile))
	}
	if e := c.Endpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
			out = append(out, "digitalocean.endpoint is not an http(s) base URL without credentials")
		}
	}
	return out
}

// checkTag is DigitalOcean's tag syntax, with proxyfleet's own prefix
// reserved.
func checkTag(t string) string {
	switch {
	case !tagPattern.MatchString(t):
		return "a tag is 1-255 letters, digits, colons, dashes and underscores"
	case strings.HasPrefix(t, tagPrefix):
		return "tags starting with " + tagPrefix + " are proxyfleet's own"
	}
	return ""
}
