package hetzner

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
const Type = "hetzner"

// DefaultImage is the image name used when neither the Proxy nor the entry
// names one: Hetzner's Debian 12, whose crypt(3) checks the bcrypt hash of
// the bootstrap's login file (docs/providers/gcp.md).
const DefaultImage = "debian-12"

// Config configures one hetzner provider entry: servers of one project
// (the token's). It is the hetzner block of the providers config file as
// written (ReadConfig decodes and validates it); New takes it from code.
type Config struct {
	// Location is the location servers are created in, such as fsn1
	// (required); a Proxy's placement.zone may name another.
	Location string `json:"location"`
	// Defaults fill Proxy placement fields left empty: zone is a location,
	// machineType a server type (cx22), image an image name (DefaultImage
	// when empty).
	Defaults providers.Placement `json:"defaults,omitempty"`
	// SourceRanges are the CIDRs (IPv4 or IPv6) the proxy port is opened
	// to: the gateways' egress addresses (required). The provider keeps
	// one firewall per entry and installation admitting them on each
	// Proxy's port and nothing else.
	SourceRanges []string `json:"sourceRanges"`
	// SSHSourceRanges, when given, also open port 22 to these CIDRs; SSH
	// is closed by default.
	SSHSourceRanges []string `json:"sshSourceRanges,omitempty"`
	// SSHKeys are IDs of the project's SSH keys put on every server;
	// without one Hetzner e-mails a root password for each server.
	SSHKeys []int64 `json:"sshKeys,omitempty"`
	// IPv6Only creates servers without a public IPv4 address (cheaper):
	// the first address of the server's /64 becomes status.ip.
	IPv6Only bool `json:"ipv6Only,omitempty"`
	// Labels are extra labels on every server; the proxyfleet.io/ prefix
	// is reserved.
	Labels map[string]string `json:"labels,omitempty"`
	// HourlyPrice is what one server costs an hour in the operator's
	// currency, reported per Proxy for cost accounting; 0 reports nothing.
	HourlyPrice float64 `json:"hourlyPrice,omitempty"`

	// TokenFile is the absolute path of a file holding the project's API
	// token (a mounted Secret), read again on every request so a rotated
	// token needs no restart. Required unless NoAuth.
	TokenFile string `json:"tokenFile,omitempty"`
	// Endpoint is the API base URL, /v1 included; empty means Hetzner's.
	// For stand-ins.
	Endpoint string `json:"endpoint,omitempty"`
	// NoAuth sends no token: only for stand-ins that check none.
	NoAuth bool `json:"noAuth,omitempty"`

	// Entry is the entry's name (not read from the block): the managed
	// firewall is named after it.
	Entry string `json:"-"`
}

// ReadConfig reads and validates e's hetzner block, with Entry set. Every
// problem is reported, each naming its field.
func ReadConfig(e providers.Entry) (Config, error) {
	var cfg Config
	if err := e.Decode(Type, &cfg); err != nil {
		return Config{}, err
	}
	cfg.Entry = e.Name
	if err := providers.Problems(cfg.validate()); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

var (
	// locationPattern is a location name (fsn1, nbg1, hel1, ash, hil, sin).
	locationPattern = regexp.MustCompile(`^[a-z]{3}[0-9]*$`)
	// serverTypePattern is a server type name (cx22, cpx11, cax21).
	serverTypePattern = regexp.MustCompile(`^[a-z]+[0-9]+[a-z0-9-]*$`)
	// imagePattern is an image name (debian-12, ubuntu-24.04).
	imagePattern = regexp.MustCompile(`^[a-z][a-z0-9.]*(-[a-z0-9.]+)*$`)
	// labelKeyPattern and labelValuePattern are Hetzner's label syntax,
	// Kubernetes' own.
	labelKeyPattern   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelValuePattern = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
)

func (c *Config) validate() []string {
	var out []string
	switch {
	case c.Location == "":
		out = append(out, "hetzner.location is required")
	case !locationPattern.MatchString(c.Location):
		out = append(out, fmt.Sprintf("hetzner.location %q is not a location (like fsn1)", c.Location))
	}
	if z := c.Defaults.Zone; z != "" && !locationPattern.MatchString(z) {
		out = append(out, fmt.Sprintf("hetzner.defaults.zone %q is not a location (like fsn1)", z))
	}
	if m := c.Defaults.MachineType; m != "" && !serverTypePattern.MatchString(m) {
		out = append(out, fmt.Sprintf("hetzner.defaults.machineType %q is not a server type (like cx22)", m))
	}
	if img := c.Defaults.Image; img != "" && !imagePattern.MatchString(img) {
		out = append(out, fmt.Sprintf("hetzner.defaults.image %q is not an image name (like debian-12)", img))
	}
	if len(c.SourceRanges) == 0 {
		out = append(out, "hetzner.sourceRanges is required (the gateways' egress CIDRs the proxy port is opened to)")
	}
	// In the order of the file, so the same mistakes read the same way each time.
	_, bad := providers.ParseCIDRs("hetzner.sourceRanges", c.SourceRanges)
	out = append(out, bad...)
	_, bad = providers.ParseCIDRs("hetzner.sshSourceRanges", c.SSHSourceRanges)
	out = append(out, bad...)
	for i, k := range c.SSHKeys {
		if k < 1 {
			out = append(out, fmt.Sprintf("hetzner.sshKeys[%d] %d is not an SSH key ID", i, k))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(c.Labels)) {
		if msg := checkLabel(k, c.Labels[k]); msg != "" {
			out = append(out, fmt.Sprintf("hetzner.labels[%s]: %s", k, msg))
		}
	}
	if c.HourlyPrice < 0 {
		out = append(out, fmt.Sprintf("hetzner.hourlyPrice %v is negative", c.HourlyPrice))
	}
	switch {
	case c.NoAuth && c.TokenFile != "":
		out = append(out, "hetzner.noAuth and hetzner.tokenFile are mutually exclusive")
	case !c.NoAuth && c.TokenFile == "":
		out = append(out, "hetzner.tokenFile is required (the path of the mounted API token)")
	case c.TokenFile != "" && !strings.HasPrefix(c.TokenFile, "/"):
		out = append(out, fmt.Sprintf("hetzner.tokenFile %q must be an absolute path", c.TokenFile))
	}
	if e := c.Endpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
			out = append(out, "hetzner.endpoint is not an http(s) base URL without credentials")
		}
	}
	return out
}

// checkLabel is Hetzner's label syntax, with proxyfleet's own prefix
// reserved.
func checkLabel(k, v string) string {
	switch {
	case !labelKeyPattern.MatchString(k) || len(k) > 253:
		return "the key is not a label key (an optional DNS prefix and /, then 1-63 letters, digits, -, _ or .)"
	case !labelValuePattern.MatchString(v):
		return fmt.Sprintf("the value %q is not a label value (0-63 letters, digits, -, _ or ., starting and ending alphanumeric)", v)
	case strings.HasPrefix(k, labelPrefix):
		return "keys starting with " + labelPrefix + " are proxyfleet's own"
	}
	return ""
}
