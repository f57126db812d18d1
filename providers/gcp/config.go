package gcp

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/api/option"

	"github.com/proxyfleet/proxyfleet/providers"
)

// Type is this provider's type in the providers config file, and the key of
// its block.
const Type = "gcp"

// Address types: which of the VM's addresses becomes status.ip.
const (
	AddressExternal = "external"
	AddressInternal = "internal"
)

// Config configures one gcp provider entry: Compute Engine VMs in one
// project. It is the gcp block of the providers config file as written
// (ReadConfig decodes and validates it), and New takes it from code.
type Config struct {
	// Project is the GCP project ID (required).
	Project string `json:"project"`
	// Defaults fill Proxy placement fields left empty.
	Defaults providers.Placement `json:"defaults,omitempty"`
	// Network and Subnetwork place the VM's one interface (names or
	// resource URLs); empty means the project's default network.
	Network    string `json:"network,omitempty"`
	Subnetwork string `json:"subnetwork,omitempty"`
	// NetworkTags are what the firewall rule opening the Squid port targets.
	NetworkTags []string `json:"networkTags,omitempty"`
	// AddressType picks the address that becomes status.ip: AddressExternal
	// (the default, the VM's NAT IP, which gateways reach from anywhere) or
	// AddressInternal (the VPC address, for clusters in the same VPC).
	AddressType string `json:"addressType,omitempty"`
	// ServiceAccount is the e-mail of the service account the VMs run as;
	// empty attaches none (the Squid needs no Google API).
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// Labels are extra labels on every VM; proxyfleet's own keys win.
	Labels map[string]string `json:"labels,omitempty"`

	// CredentialsFile, Endpoint and NoAuth are the Compute client's options
	// (clientOptions), used by Constructor; New takes a client made already.

	// CredentialsFile is a service-account key file; empty means
	// Application Default Credentials.
	CredentialsFile string `json:"credentialsFile,omitempty"`
	// Endpoint is the Compute API base URL; empty means Google's. For
	// private endpoints and emulators.
	Endpoint string `json:"endpoint,omitempty"`
	// NoAuth sends no credentials at all: only for emulators and tests.
	NoAuth bool `json:"noAuth,omitempty"`
}

// ReadConfig reads and validates e's gcp block, with AddressType defaulted.
// Every problem is reported (providers.Problems), each naming its field
// ("gcp.project is required").
func ReadConfig(e providers.Entry) (Config, error) {
	var cfg Config
	if err := e.Decode(Type, &cfg); err != nil {
		return Config{}, err
	}
	if err := providers.Problems(append(cfg.validatePlacement(), cfg.validateIdentity()...)); err != nil {
		return Config{}, err
	}
	if cfg.AddressType == "" {
		cfg.AddressType = AddressExternal
	}
	return cfg, nil
}

var (
	// projectPattern is a project ID: 6-30 characters.
	projectPattern = regexp.MustCompile(`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`)
	// machineTypePattern is a machine type name (e2-micro, n2-custom-4-8192).
	machineTypePattern = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)
	// labelKey and labelValue are Compute Engine's label syntax.
	labelKey   = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	labelValue = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
)

// validatePlacement checks the project and where VMs go: defaults, network
// and tags, the address type.
func (c *Config) validatePlacement() []string {
	var out []string
	switch {
	case c.Project == "":
		out = append(out, "gcp.project is required")
	case !projectPattern.MatchString(c.Project):
		out = append(out, fmt.Sprintf("gcp.project %q is not a project ID (6-30 lower-case letters, digits and hyphens, starting with a letter)", c.Project))
	}
	if z := c.Defaults.Zone; z != "" && !zonePattern.MatchString(z) {
		out = append(out, fmt.Sprintf("gcp.defaults.zone %q is not a zone (like europe-west1-b)", z))
	}
	if m := c.Defaults.MachineType; m != "" && !machineTypePattern.MatchString(m) {
		out = append(out, fmt.Sprintf("gcp.defaults.machineType %q is not a machine type (like e2-micro)", m))
	}
	for field, v := range map[string]string{"gcp.defaults.image": c.Defaults.Image, "gcp.network": c.Network, "gcp.subnetwork": c.Subnetwork} {
		if strings.ContainsAny(v, " \t\n") {
			out = append(out, fmt.Sprintf("%s %q contains whitespace", field, v))
		}
	}
	for i, tag := range c.NetworkTags {
		if !namePattern.MatchString(tag) {
			out = append(out, fmt.Sprintf("gcp.networkTags[%d] %q is not a network tag (1-63 lower-case letters, digits and hyphens, starting with a letter)", i, tag))
		}
	}
	switch c.AddressType {
	case "", AddressExternal, AddressInternal:
	default:
		out = append(out, fmt.Sprintf("gcp.addressType %q is not external or internal", c.AddressType))
	}
	return out
}

// validateIdentity checks what the VMs carry and how the client logs in:
// service account, labels, credentials and endpoint.
func (c *Config) validateIdentity() []string {
	var out []string
	if sa := c.ServiceAccount; sa != "" && (!strings.Contains(sa, "@") || strings.ContainsAny(sa, " \t\n")) {
		out = append(out, fmt.Sprintf("gcp.serviceAccount %q is not a service account e-mail", sa))
	}
	for _, k := range slices.Sorted(maps.Keys(c.Labels)) {
		if !labelKey.MatchString(k) {
			out = append(out, fmt.Sprintf("gcp.labels[%s]: the key is not a GCP label key (lower-case letters, digits, _ and -, starting with a letter, at most 63)", k))
		}
		if !labelValue.MatchString(c.Labels[k]) {
			out = append(out, fmt.Sprintf("gcp.labels[%s]: the value %q is not a GCP label value (lower-case letters, digits, _ and -, at most 63)", k, c.Labels[k]))
		}
	}
	if f := c.CredentialsFile; f != "" && !strings.HasPrefix(f, "/") {
		out = append(out, fmt.Sprintf("gcp.credentialsFile %q must be an absolute path", f))
	}
	if e := c.Endpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			out = append(out, "gcp.endpoint is not an http(s) base URL without credentials")
		}
	}
	if c.NoAuth && c.CredentialsFile != "" {
		out = append(out, "gcp.noAuth and gcp.credentialsFile are mutually exclusive")
	}
	return out
}

// clientOptions turns the credential and endpoint keys into client options:
// a service-account key file, Application Default Credentials when none is
// named, or no credentials at all (noAuth, for emulators and tests). The
// options hold a file path, never key material, so logging them is safe.
func (c *Config) clientOptions() []option.ClientOption {
	var opts []option.ClientOption
	switch {
	case c.NoAuth:
		opts = append(opts, option.WithoutAuthentication())
	case c.CredentialsFile != "":
		opts = append(opts, option.WithAuthCredentialsFile(option.ServiceAccount, c.CredentialsFile))
	}
	if c.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(c.Endpoint))
	}
	return opts
}
