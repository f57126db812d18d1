package providers

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/internal/strictyaml"
)

// Provider types the config file knows. Which of them this binary can build is
// up to the constructors handed to NewRegistry.
const (
	TypeKubernetes = "kubernetes"
	TypeGCP        = "gcp"
	TypeKVM        = "kvm"
)

// KnownTypes lists every type the config file accepts, sorted.
func KnownTypes() []string { return []string{TypeGCP, TypeKubernetes, TypeKVM} }

// Config is the providers config file: named provider entries that
// Proxy.spec.provider refers to.
type Config struct {
	Providers []Entry `json:"providers"`
}

// Entry is one configured provider: a name, a type, and exactly the block of
// settings for that type.
type Entry struct {
	// Name is what Proxy.spec.provider names; a DNS-1123 label, unique in the file.
	Name string `json:"name"`
	// Type selects the backend: kubernetes, gcp or kvm.
	Type       string            `json:"type"`
	Kubernetes *KubernetesConfig `json:"kubernetes,omitempty"`
	GCP        *GCPConfig        `json:"gcp,omitempty"`
	KVM        *KVMConfig        `json:"kvm,omitempty"`
}

// KubernetesConfig is the block of a kubernetes entry: Squid Pods in this cluster.
type KubernetesConfig struct {
	// Namespace the Pods are created in (required).
	Namespace string `json:"namespace"`
	// Image is the Squid container image; empty means the provider's pinned default.
	Image string `json:"image,omitempty"`
	// ClusterCIDRs are the cluster's Pod and Service ranges when they are not
	// already private (RFC 1918, CGNAT, ULA): Squid denies them as
	// destinations and accepts clients from them.
	ClusterCIDRs []string `json:"clusterCIDRs,omitempty"`
	// ClientCIDRs replaces the default set of source ranges allowed to use the
	// proxy (RFC 1918, CGNAT, ULA).
	ClientCIDRs []string `json:"clientCIDRs,omitempty"`
}

// GCPConfig is the block of a gcp entry: Compute Engine VMs in one project.
type GCPConfig struct {
	// Project is the GCP project ID (required).
	Project string `json:"project"`
	// Defaults fill Proxy placement fields left empty.
	Defaults GCPDefaults `json:"defaults,omitempty"`
	// Network and Subnetwork place the VM's one interface (names or
	// resource URLs); empty means the project's default network.
	Network    string `json:"network,omitempty"`
	Subnetwork string `json:"subnetwork,omitempty"`
	// NetworkTags are what the firewall rule opening the Squid port targets.
	NetworkTags []string `json:"networkTags,omitempty"`
	// AddressType picks the address that becomes status.ip: "external" (the
	// default, the VM's NAT IP, which gateways reach from anywhere) or
	// "internal" (the VPC address, for clusters in the same VPC).
	AddressType string `json:"addressType,omitempty"`
	// ServiceAccount is the e-mail of the service account the VMs run as;
	// empty attaches none (the Squid needs no Google API).
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// Labels are extra labels on every VM; proxyfleet's own keys win.
	Labels map[string]string `json:"labels,omitempty"`
	// CredentialsFile is a service-account key file; empty means
	// Application Default Credentials.
	CredentialsFile string `json:"credentialsFile,omitempty"`
	// Endpoint is the Compute API base URL; empty means Google's. For
	// private endpoints and emulators.
	Endpoint string `json:"endpoint,omitempty"`
	// NoAuth sends no credentials at all: only for emulators and tests.
	NoAuth bool `json:"noAuth,omitempty"`
}

// GCP address types.
const (
	GCPAddressExternal = "external"
	GCPAddressInternal = "internal"
)

// GCPDefaults are per-entry placement defaults for gcp.
type GCPDefaults struct {
	Zone        string `json:"zone,omitempty"`
	MachineType string `json:"machineType,omitempty"`
	Image       string `json:"image,omitempty"`
}

// KVMConfig is the block of a kvm entry: libvirt guests on hosts reached over SSH.
type KVMConfig struct {
	// SSH is how the controller logs in to every host.
	SSH KVMSSH `json:"ssh"`
	// Hosts are the hypervisors; placement.zone picks one by name.
	Hosts []KVMHost `json:"hosts"`
	// Images maps a name placement.image may use to a cloud image.
	Images map[string]KVMImage `json:"images,omitempty"`
	// MachineTypes maps a name placement.machineType may use to a guest shape.
	MachineTypes map[string]KVMMachineType `json:"machineTypes,omitempty"`
	// Defaults fill Proxy placement fields left empty (a host name, an
	// images key, a machineTypes key).
	Defaults KVMDefaults `json:"defaults,omitempty"`
	// DomainType is libvirt's domain type: "kvm" (the default, hardware
	// virtualisation) or "qemu" (software emulation, for hosts without a
	// usable /dev/kvm).
	DomainType string `json:"domainType,omitempty"`
	// InstallGuestAgent ships a vendor-data script that installs and starts
	// qemu-guest-agent, the provider's best source of the guest's address.
	// Default true.
	InstallGuestAgent *bool `json:"installGuestAgent,omitempty"`
	// VendorData is extra cloud-init vendor-data for every guest, sent
	// beside the guest-agent script (as MIME multipart when both are set).
	VendorData string `json:"vendorData,omitempty"`
}

// KVMDefaults are per-entry placement defaults for kvm.
type KVMDefaults struct {
	Zone        string `json:"zone,omitempty"`
	MachineType string `json:"machineType,omitempty"`
	Image       string `json:"image,omitempty"`
}

// KVM domain types.
const (
	KVMDomainKVM  = "kvm"
	KVMDomainQEMU = "qemu"
)

// KVMSSH holds the SSH login shared by all hosts of a kvm entry.
type KVMSSH struct {
	User string `json:"user"`
	// PrivateKeyFile and KnownHostsFile are absolute paths (a mounted Secret).
	// Host keys are always verified, so known_hosts is required. Both are
	// read again on every dial, so a rotated Secret needs no restart.
	PrivateKeyFile string `json:"privateKeyFile"`
	KnownHostsFile string `json:"knownHostsFile"`
	// Socket is the libvirt socket path on the hosts; empty means
	// /var/run/libvirt/libvirt-sock (the system daemon).
	Socket string `json:"socket,omitempty"`
}

// KVMHost is one hypervisor of a kvm entry.
type KVMHost struct {
	// Name is the host's identifier in providerIDs and placement.zone.
	Name string `json:"name"`
	// Address is host:port of its sshd.
	Address string `json:"address"`
	// Pool is the libvirt storage pool for images and disks (default "default").
	Pool string `json:"pool,omitempty"`
	// Network is the libvirt network the guests attach to, or Bridge a host
	// bridge; at most one of them. Neither means the network "default".
	Network string `json:"network,omitempty"`
	Bridge  string `json:"bridge,omitempty"`
}

// KVMImage is a downloadable base image.
type KVMImage struct {
	URL string `json:"url"`
	// SHA256 is the expected hex digest; empty skips verification.
	SHA256 string `json:"sha256,omitempty"`
	// Format is the image's disk format: "qcow2" (default) or "raw".
	Format string `json:"format,omitempty"`
	// Firmware is "uefi" (default) or "bios".
	Firmware string `json:"firmware,omitempty"`
}

// KVMMachineType is a guest shape.
type KVMMachineType struct {
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memoryMiB"`
	DiskGiB   int `json:"diskGiB"`
}

// LoadConfig reads and validates the providers config file at path.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("providers config: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("providers config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes YAML (or JSON) strictly — unknown and duplicate keys are
// errors — and validates the result. Every error names the entry and field,
// and a decoding error the line.
func ParseConfig(data []byte) (Config, error) {
	root, err := strictyaml.Parse(data)
	if err != nil {
		return Config{}, err
	}
	var cfg Config
	if root.IsNull() {
		return cfg, nil
	}
	top, ok := root.Mapping()
	if !ok {
		return Config{}, errors.New("the file must be a mapping with a providers list")
	}
	var list *strictyaml.Node
	for _, e := range top {
		if e.Key != "providers" {
			return Config{}, fmt.Errorf("unknown field %q (line %d; the file has one key, providers)", e.Key, e.Line)
		}
		list = e.Value
	}
	var raw []*strictyaml.Node
	if !list.IsNull() {
		if raw, ok = list.Sequence(); !ok {
			return Config{}, fmt.Errorf("providers must be a list of entries (line %d)", list.Line())
		}
	}
	var errs []error
	for i, r := range raw {
		e, err := decodeEntry(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", entryLabel(i, peekName(r)), err))
			continue
		}
		cfg.Providers = append(cfg.Providers, e)
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return cfg, cfg.Validate()
}

// decodeEntry decodes one entry, reporting unknown keys by their full path.
func decodeEntry(r *strictyaml.Node) (Entry, error) {
	if _, ok := r.Mapping(); !ok {
		return Entry{}, fmt.Errorf("an entry must be a mapping (line %d)", r.Line())
	}
	var e Entry
	if err := r.Decode(&e); err != nil {
		return Entry{}, err
	}
	return e, nil
}

// peekName reads an entry's name leniently, for error messages.
func peekName(r *strictyaml.Node) string {
	entries, _ := r.Mapping()
	for _, e := range entries {
		if e.Key == "name" {
			v, _ := e.Value.Value()
			s, _ := v.(string)
			return s
		}
	}
	return ""
}

func entryLabel(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("providers[%d]", i)
	}
	return fmt.Sprintf("providers[%d] (%s)", i, name)
}

// Validate checks every entry and returns all problems, one per line, each
// prefixed with the entry ("providers[1] (gcp-eu): gcp.project is required").
func (c Config) Validate() error {
	var errs []error
	seen := map[string]int{}
	for i, e := range c.Providers {
		label := entryLabel(i, e.Name)
		add := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s", label, fmt.Sprintf(format, args...)))
		}
		switch {
		case e.Name == "":
			add("name is required")
		default:
			if msgs := validation.IsDNS1123Label(e.Name); len(msgs) > 0 {
				add("name %q is not a DNS-1123 label: %s", e.Name, strings.Join(msgs, "; "))
			}
			if j, dup := seen[e.Name]; dup {
				add("name %q is already used by providers[%d]", e.Name, j)
			} else {
				seen[e.Name] = i
			}
		}
		blocks := map[string]bool{
			TypeKubernetes: e.Kubernetes != nil,
			TypeGCP:        e.GCP != nil,
			TypeKVM:        e.KVM != nil,
		}
		switch e.Type {
		case "":
			add("type is required (one of %s)", strings.Join(KnownTypes(), ", "))
		case TypeKubernetes, TypeGCP, TypeKVM:
			if !blocks[e.Type] {
				add("%s block is required for type %s", e.Type, e.Type)
			}
		default:
			add("type %q is unknown (want one of %s)", e.Type, strings.Join(KnownTypes(), ", "))
		}
		for _, t := range KnownTypes() {
			if blocks[t] && t != e.Type {
				add("%s block is not allowed for type %q", t, e.Type)
			}
		}
		var problems []string
		switch {
		case e.Type == TypeKubernetes && e.Kubernetes != nil:
			problems = e.Kubernetes.validate()
		case e.Type == TypeGCP && e.GCP != nil:
			problems = e.GCP.validate()
		case e.Type == TypeKVM && e.KVM != nil:
			problems = e.KVM.validate()
		}
		for _, p := range problems {
			add("%s", p)
		}
	}
	return errors.Join(errs...)
}

var imageRef = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$`)

func (k *KubernetesConfig) validate() []string {
	var out []string
	if k.Namespace == "" {
		out = append(out, "kubernetes.namespace is required")
	} else if msgs := validation.IsDNS1123Label(k.Namespace); len(msgs) > 0 {
		out = append(out, fmt.Sprintf("kubernetes.namespace %q is not a DNS-1123 label: %s", k.Namespace, strings.Join(msgs, "; ")))
	}
	if k.Image != "" && !imageRef.MatchString(k.Image) {
		out = append(out, fmt.Sprintf("kubernetes.image %q is not an image reference", k.Image))
	}
	out = append(out, validatePrefixes("kubernetes.clusterCIDRs", k.ClusterCIDRs)...)
	out = append(out, validatePrefixes("kubernetes.clientCIDRs", k.ClientCIDRs)...)
	return out
}

func validatePrefixes(field string, list []string) []string {
	var out []string
	for i, s := range list {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("%s[%d] %q is not a CIDR", field, i, s))
		case p.Masked() != p:
			out = append(out, fmt.Sprintf("%s[%d] %q has host bits set (did you mean %s?)", field, i, s, p.Masked()))
		}
	}
	return out
}

// ParsePrefixes parses CIDRs that Validate accepted.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

var (
	gcpProject = regexp.MustCompile(`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`)
	gcpZone    = regexp.MustCompile(`^[a-z]+-[a-z]+[0-9]+-[a-z]$`)
	gcpName    = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)
)

func (g *GCPConfig) validate() []string {
	var out []string
	switch {
	case g.Project == "":
		out = append(out, "gcp.project is required")
	case !gcpProject.MatchString(g.Project):
		out = append(out, fmt.Sprintf("gcp.project %q is not a project ID (6-30 lower-case letters, digits and hyphens, starting with a letter)", g.Project))
	}
	if z := g.Defaults.Zone; z != "" && !gcpZone.MatchString(z) {
		out = append(out, fmt.Sprintf("gcp.defaults.zone %q is not a zone (like europe-west1-b)", z))
	}
	if m := g.Defaults.MachineType; m != "" && !gcpName.MatchString(m) {
		out = append(out, fmt.Sprintf("gcp.defaults.machineType %q is not a machine type (like e2-micro)", m))
	}
	if img := g.Defaults.Image; img != "" && strings.ContainsAny(img, " \t\n") {
		out = append(out, fmt.Sprintf("gcp.defaults.image %q contains whitespace", img))
	}
	for field, v := range map[string]string{"gcp.network": g.Network, "gcp.subnetwork": g.Subnetwork} {
		if strings.ContainsAny(v, " \t\n") {
			out = append(out, fmt.Sprintf("%s %q contains whitespace", field, v))
		}
	}
	for i, tag := range g.NetworkTags {
		if len(tag) > 63 || !gcpName.MatchString(tag) {
			out = append(out, fmt.Sprintf("gcp.networkTags[%d] %q is not a network tag (1-63 lower-case letters, digits and hyphens, starting with a letter)", i, tag))
		}
	}
	switch g.AddressType {
	case "", GCPAddressExternal, GCPAddressInternal:
	default:
		out = append(out, fmt.Sprintf("gcp.addressType %q is not external or internal", g.AddressType))
	}
	if sa := g.ServiceAccount; sa != "" && (!strings.Contains(sa, "@") || strings.ContainsAny(sa, " \t\n")) {
		out = append(out, fmt.Sprintf("gcp.serviceAccount %q is not a service account e-mail", sa))
	}
	for _, k := range slices.Sorted(maps.Keys(g.Labels)) {
		if !GCPLabelKey.MatchString(k) {
			out = append(out, fmt.Sprintf("gcp.labels[%s]: the key is not a GCP label key (lower-case letters, digits, _ and -, starting with a letter, at most 63)", k))
		}
		if !GCPLabelValue.MatchString(g.Labels[k]) {
			out = append(out, fmt.Sprintf("gcp.labels[%s]: the value %q is not a GCP label value (lower-case letters, digits, _ and -, at most 63)", k, g.Labels[k]))
		}
	}
	if f := g.CredentialsFile; f != "" && !strings.HasPrefix(f, "/") {
		out = append(out, fmt.Sprintf("gcp.credentialsFile %q must be an absolute path", f))
	}
	if e := g.Endpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			out = append(out, "gcp.endpoint is not an http(s) base URL without credentials")
		}
	}
	if g.NoAuth && g.CredentialsFile != "" {
		out = append(out, "gcp.noAuth and gcp.credentialsFile are mutually exclusive")
	}
	sort.Strings(out)
	return out
}

// GCPLabelKey and GCPLabelValue are Compute Engine's label syntax.
var (
	GCPLabelKey   = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	GCPLabelValue = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
)

var (
	hex64         = regexp.MustCompile(`^[0-9a-f]{64}$`)
	kvmObjectName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

func (k *KVMConfig) validate() []string {
	var out []string
	if k.SSH.User == "" {
		out = append(out, "kvm.ssh.user is required")
	}
	for field, v := range map[string]string{"kvm.ssh.privateKeyFile": k.SSH.PrivateKeyFile, "kvm.ssh.knownHostsFile": k.SSH.KnownHostsFile} {
		switch {
		case v == "":
			out = append(out, field+" is required")
		case !strings.HasPrefix(v, "/"):
			out = append(out, fmt.Sprintf("%s %q must be an absolute path", field, v))
		}
	}
	if len(k.Hosts) == 0 {
		out = append(out, "kvm.hosts needs at least one host")
	}
	hosts := map[string]bool{}
	for i, h := range k.Hosts {
		f := fmt.Sprintf("kvm.hosts[%d]", i)
		switch {
		case h.Name == "":
			out = append(out, f+".name is required")
		case len(validation.IsDNS1123Label(h.Name)) > 0:
			out = append(out, fmt.Sprintf("%s.name %q is not a DNS-1123 label", f, h.Name))
		case hosts[h.Name]:
			out = append(out, fmt.Sprintf("%s.name %q is used twice", f, h.Name))
		}
		hosts[h.Name] = true
		if h.Address == "" {
			out = append(out, f+".address is required")
		} else if host, port, err := net.SplitHostPort(h.Address); err != nil || host == "" {
			out = append(out, fmt.Sprintf("%s.address %q is not host:port", f, h.Address))
		} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			out = append(out, fmt.Sprintf("%s.address %q has no valid port", f, h.Address))
		}
		if h.Network != "" && h.Bridge != "" {
			out = append(out, f+": network and bridge are mutually exclusive")
		}
		for field, v := range map[string]string{"pool": h.Pool, "network": h.Network, "bridge": h.Bridge} {
			if v != "" && !kvmObjectName.MatchString(v) {
				out = append(out, fmt.Sprintf("%s.%s %q is not a plain libvirt name (letters, digits, '.', '_', '-')", f, field, v))
			}
		}
	}
	for _, key := range slices.Sorted(maps.Keys(k.Images)) {
		img := k.Images[key]
		f := fmt.Sprintf("kvm.images[%s]", key)
		if len(validation.IsDNS1123Label(key)) > 0 {
			out = append(out, fmt.Sprintf("%s: the key is not a DNS-1123 label", f))
		}
		if u, err := url.Parse(img.URL); img.URL == "" {
			out = append(out, f+".url is required")
		} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			out = append(out, fmt.Sprintf("%s.url %q is not an http(s) URL", f, redact.URL(img.URL)))
		}
		if img.SHA256 != "" && !hex64.MatchString(img.SHA256) {
			out = append(out, fmt.Sprintf("%s.sha256 is not 64 lower-case hex digits", f))
		}
		if img.Format != "" && img.Format != "qcow2" && img.Format != "raw" {
			out = append(out, fmt.Sprintf("%s.format %q is not qcow2 or raw", f, img.Format))
		}
		if img.Firmware != "" && img.Firmware != "uefi" && img.Firmware != "bios" {
			out = append(out, fmt.Sprintf("%s.firmware %q is not uefi or bios", f, img.Firmware))
		}
	}
	if z := k.Defaults.Zone; z != "" && !hosts[z] {
		out = append(out, fmt.Sprintf("kvm.defaults.zone %q is not a configured host", z))
	}
	if img := k.Defaults.Image; img != "" {
		if _, ok := k.Images[img]; !ok {
			out = append(out, fmt.Sprintf("kvm.defaults.image %q is not a kvm.images key", img))
		}
	}
	if mt := k.Defaults.MachineType; mt != "" {
		if _, ok := k.MachineTypes[mt]; !ok {
			out = append(out, fmt.Sprintf("kvm.defaults.machineType %q is not a kvm.machineTypes key", mt))
		}
	}
	switch k.DomainType {
	case "", KVMDomainKVM, KVMDomainQEMU:
	default:
		out = append(out, fmt.Sprintf("kvm.domainType %q is not kvm or qemu", k.DomainType))
	}
	if s := k.SSH.Socket; s != "" && !strings.HasPrefix(s, "/") {
		out = append(out, fmt.Sprintf("kvm.ssh.socket %q must be an absolute path", s))
	}
	for _, key := range slices.Sorted(maps.Keys(k.MachineTypes)) {
		mt := k.MachineTypes[key]
		f := fmt.Sprintf("kvm.machineTypes[%s]", key)
		if len(validation.IsDNS1123Label(key)) > 0 {
			out = append(out, fmt.Sprintf("%s: the key is not a DNS-1123 label", f))
		}
		if mt.VCPUs < 1 {
			out = append(out, f+".vcpus must be at least 1")
		}
		if mt.MemoryMiB < 128 {
			out = append(out, f+".memoryMiB must be at least 128")
		}
		if mt.DiskGiB < 1 {
			out = append(out, f+".diskGiB must be at least 1")
		}
	}
	sort.Strings(out)
	return out
}
