package kvm

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/providers"
)

// Type is this provider's type in the providers config file, and the key of
// its block.
const Type = "kvm"

// Domain types: libvirt's domain type for the guests.
const (
	// DomainKVM is hardware virtualisation, the default.
	DomainKVM = "kvm"
	// DomainQEMU is software emulation, for hosts without a usable /dev/kvm.
	DomainQEMU = "qemu"
)

// CPU modes: what a kvm guest's CPU is. Any other cpuMode value names one
// of libvirt's CPU models (virsh cpu-models x86_64: Haswell-noTSX,
// EPYC-Rome, qemu64, ...).
const (
	// CPUHostPassthrough gives the guest the host's CPU as it is, the
	// default: the fastest, and what Squid's TLS code profits from.
	CPUHostPassthrough = "host-passthrough"
	// CPUHostModel gives the guest the named model closest to the host's
	// CPU, for hosts (nested virtualisation among them) that refuse to
	// pass some of the host's features or MSRs through.
	CPUHostModel = "host-model"
)

// cpuModel is a libvirt CPU model name.
var cpuModel = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// Host is one configured hypervisor: an item of the block's hosts.
type Host struct {
	// Name is the host's identifier in providerIDs and placement.zone.
	Name string `json:"name"`
	// Address is host:port of its sshd.
	Address string `json:"address"`
	// Pool is the storage pool for base images, overlays and seeds
	// ("default" when empty).
	Pool string `json:"pool,omitempty"`
	// Network (a libvirt network) or Bridge (a host bridge) is what the
	// guest's NIC joins; at most one in the file, exactly one after New
	// (the network "default" when neither).
	Network string `json:"network,omitempty"`
	Bridge  string `json:"bridge,omitempty"`
}

// Image is one configured base image: a value of the block's images.
type Image struct {
	// URL is where the controller downloads it from.
	URL string `json:"url"`
	// SHA256 is the expected digest of the download; empty skips the check.
	SHA256 string `json:"sha256,omitempty"`
	// Format is qcow2 (the default) or raw.
	Format string `json:"format,omitempty"`
	// Firmware is FirmwareUEFI (the default) or FirmwareBIOS.
	Firmware string `json:"firmware,omitempty"`
}

// MachineType is one configured guest shape: a value of the block's
// machineTypes.
type MachineType struct {
	// VCPUs and MemoryMiB size the guest; DiskGiB is its overlay's size.
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memoryMiB"`
	DiskGiB   int `json:"diskGiB"`
}

// Config configures one kvm entry; ReadConfig fills it from the providers
// config file, and New applies the defaults.
type Config struct {
	// Entry is the entry's name; it becomes part of base image names.
	Entry string
	// User, KeyFile and KnownHosts are the SSH login for every host; the
	// files are read on every dial.
	User, KeyFile, KnownHosts string
	// Socket is libvirt's socket path on the hosts (DefaultSocket if empty).
	Socket string
	// Hosts are the hypervisors.
	Hosts []Host
	// Images and MachineTypes are what placement.image and
	// placement.machineType name.
	Images       map[string]Image
	MachineTypes map[string]MachineType
	// Defaults fill placement fields a Proxy leaves empty.
	Defaults providers.Placement
	// DomainType is DomainKVM (default) or DomainQEMU.
	DomainType string
	// CPUMode is CPUHostPassthrough (default), CPUHostModel or a libvirt
	// CPU model name; with DomainQEMU only a model name applies.
	CPUMode string
	// GuestAgent ships the qemu-guest-agent installer as vendor-data.
	GuestAgent bool
	// VendorData is extra vendor-data for every guest.
	VendorData []byte
	// Budgets bound every step; a zero field takes DefaultBudgets' value.
	Budgets Budgets
	// Log receives connection events and the no-op Delete of an
	// unconfigured host; never a key or a login.
	Log logr.Logger
}

// block is the kvm block of a providers config entry, as written: libvirt
// guests on hosts reached over SSH.
type block struct {
	// SSH is how the controller logs in to every host.
	SSH sshBlock `json:"ssh"`
	// Hosts are the hypervisors; placement.zone picks one by name.
	Hosts []Host `json:"hosts"`
	// Images maps a name placement.image may use to a cloud image.
	Images map[string]Image `json:"images,omitempty"`
	// MachineTypes maps a name placement.machineType may use to a guest shape.
	MachineTypes map[string]MachineType `json:"machineTypes,omitempty"`
	// Defaults fill Proxy placement fields left empty (a host name, an
	// images key, a machineTypes key).
	Defaults providers.Placement `json:"defaults,omitempty"`
	// DomainType is libvirt's domain type, DomainKVM or DomainQEMU.
	DomainType string `json:"domainType,omitempty"`
	// CPUMode is the guests' CPU: CPUHostPassthrough (the default with
	// kvm), CPUHostModel, or a libvirt CPU model name (the only form that
	// applies to qemu, whose default is QEMU's own model).
	CPUMode string `json:"cpuMode,omitempty"`
	// InstallGuestAgent ships a vendor-data script that installs and starts
	// qemu-guest-agent, the provider's best source of the guest's address.
	// Default true.
	InstallGuestAgent *bool `json:"installGuestAgent,omitempty"`
	// VendorData is extra cloud-init vendor-data for every guest, sent
	// beside the guest-agent script (as MIME multipart when both are set).
	VendorData string `json:"vendorData,omitempty"`
}

// sshBlock holds the SSH login shared by all hosts of a kvm entry.
type sshBlock struct {
	User string `json:"user"`
	// PrivateKeyFile and KnownHostsFile are absolute paths (a mounted Secret).
	// Host keys are always verified, so known_hosts is required. Both are
	// read again on every dial, so a rotated Secret needs no restart.
	PrivateKeyFile string `json:"privateKeyFile"`
	KnownHostsFile string `json:"knownHostsFile"`
	// Socket is the libvirt socket path on the hosts; empty means
	// DefaultSocket (the system daemon).
	Socket string `json:"socket,omitempty"`
}

// ReadConfig reads and validates e's kvm block into a Config with
// DefaultBudgets and a discarding logger. Every problem is reported
// (providers.Problems), each naming its field ("kvm.hosts[0].address is
// required").
func ReadConfig(e providers.Entry) (Config, error) {
	var b block
	if err := e.Decode(Type, &b); err != nil {
		return Config{}, err
	}
	if err := b.validate(); err != nil {
		return Config{}, err
	}
	cfg := Config{
		Entry: e.Name, User: b.SSH.User, KeyFile: b.SSH.PrivateKeyFile, KnownHosts: b.SSH.KnownHostsFile, Socket: b.SSH.Socket,
		Hosts: b.Hosts, Images: map[string]Image{}, MachineTypes: map[string]MachineType{}, Defaults: b.Defaults,
		DomainType: b.DomainType, CPUMode: b.CPUMode, GuestAgent: b.InstallGuestAgent == nil || *b.InstallGuestAgent,
		VendorData: []byte(b.VendorData), Budgets: DefaultBudgets(), Log: logr.Discard(),
	}
	maps.Copy(cfg.Images, b.Images)
	maps.Copy(cfg.MachineTypes, b.MachineTypes)
	return cfg, nil
}

// objectName is a plain libvirt pool, network or bridge name.
var objectName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// validate returns every problem of the block (providers.Problems).
func (b *block) validate() error {
	out := b.validateSSH()
	hosts, problems := b.validateHosts()
	out = append(out, problems...)
	out = append(out, b.validateImages()...)
	out = append(out, b.validateMachineTypes()...)
	out = append(out, b.validateDefaults(hosts)...)
	switch b.DomainType {
	case "", DomainKVM, DomainQEMU:
	default:
		out = append(out, fmt.Sprintf("kvm.domainType %q is not kvm or qemu", b.DomainType))
	}
	if err := checkCPUMode(b.DomainType, b.CPUMode); err != nil {
		out = append(out, err.Error())
	}
	return providers.Problems(out)
}

// checkCPUMode refuses a cpuMode libvirt cannot use with domainType (""
// is kvm): software emulation has no host CPU to pass through or model.
func checkCPUMode(domainType, mode string) error {
	switch {
	case mode == "":
		return nil
	case mode == CPUHostPassthrough || mode == CPUHostModel:
		if domainType == DomainQEMU {
			return fmt.Errorf("kvm.cpuMode %q needs domainType kvm (software emulation has no host CPU to pass through; name a CPU model such as qemu64, or leave cpuMode out)", mode)
		}
		return nil
	case !cpuModel.MatchString(mode) || len(mode) > 64:
		return fmt.Errorf("kvm.cpuMode %q is not host-passthrough, host-model or a libvirt CPU model name (letters, digits, '.', '_', '-')", mode)
	}
	return nil
}

func (b *block) validateSSH() []string {
	var out []string
	if b.SSH.User == "" {
		out = append(out, "kvm.ssh.user is required")
	}
	for field, v := range map[string]string{"kvm.ssh.privateKeyFile": b.SSH.PrivateKeyFile, "kvm.ssh.knownHostsFile": b.SSH.KnownHostsFile} {
		switch {
		case v == "":
			out = append(out, field+" is required")
		case !strings.HasPrefix(v, "/"):
			out = append(out, fmt.Sprintf("%s %q must be an absolute path", field, v))
		}
	}
	if s := b.SSH.Socket; s != "" && !strings.HasPrefix(s, "/") {
		out = append(out, fmt.Sprintf("kvm.ssh.socket %q must be an absolute path", s))
	}
	return out
}

// validateHosts checks the hosts and returns the names configured.
func (b *block) validateHosts() (map[string]bool, []string) {
	var out []string
	if len(b.Hosts) == 0 {
		out = append(out, "kvm.hosts needs at least one host")
	}
	names := map[string]bool{}
	for i, h := range b.Hosts {
		f := fmt.Sprintf("kvm.hosts[%d]", i)
		switch {
		case h.Name == "":
			out = append(out, f+".name is required")
		case len(validation.IsDNS1123Label(h.Name)) > 0:
			out = append(out, fmt.Sprintf("%s.name %q is not a DNS-1123 label", f, h.Name))
		case names[h.Name]:
			out = append(out, fmt.Sprintf("%s.name %q is used twice", f, h.Name))
		}
		names[h.Name] = true
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
			if v != "" && !objectName.MatchString(v) {
				out = append(out, fmt.Sprintf("%s.%s %q is not a plain libvirt name (letters, digits, '.', '_', '-')", f, field, v))
			}
		}
	}
	return names, out
}

func (b *block) validateImages() []string {
	var out []string
	for _, key := range slices.Sorted(maps.Keys(b.Images)) {
		img := b.Images[key]
		f := fmt.Sprintf("kvm.images[%s]", key)
		if len(validation.IsDNS1123Label(key)) > 0 {
			out = append(out, fmt.Sprintf("%s: the key is not a DNS-1123 label", f))
		}
		if u, err := url.Parse(img.URL); img.URL == "" {
			out = append(out, f+".url is required")
		} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			out = append(out, fmt.Sprintf("%s.url %q is not an http(s) URL", f, redact.URL(img.URL)))
		}
		if img.SHA256 != "" && !hex64(img.SHA256) {
			out = append(out, fmt.Sprintf("%s.sha256 is not 64 lower-case hex digits", f))
		}
		if img.Format != "" && img.Format != "qcow2" && img.Format != "raw" {
			out = append(out, fmt.Sprintf("%s.format %q is not qcow2 or raw", f, img.Format))
		}
		if img.Firmware != "" && img.Firmware != FirmwareUEFI && img.Firmware != FirmwareBIOS {
			out = append(out, fmt.Sprintf("%s.firmware %q is not uefi or bios", f, img.Firmware))
		}
	}
	return out
}

func (b *block) validateMachineTypes() []string {
	var out []string
	for _, key := range slices.Sorted(maps.Keys(b.MachineTypes)) {
		mt := b.MachineTypes[key]
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
	return out
}

// validateDefaults checks that the defaults name a configured host, image
// and machine type.
func (b *block) validateDefaults(hosts map[string]bool) []string {
	var out []string
	if z := b.Defaults.Zone; z != "" && !hosts[z] {
		out = append(out, fmt.Sprintf("kvm.defaults.zone %q is not a configured host", z))
	}
	if img := b.Defaults.Image; img != "" {
		if _, ok := b.Images[img]; !ok {
			out = append(out, fmt.Sprintf("kvm.defaults.image %q is not a kvm.images key", img))
		}
	}
	if mt := b.Defaults.MachineType; mt != "" {
		if _, ok := b.MachineTypes[mt]; !ok {
			out = append(out, fmt.Sprintf("kvm.defaults.machineType %q is not a kvm.machineTypes key", mt))
		}
	}
	return out
}
