package kvm

import (
	"encoding/xml"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/providers"
)

// MetadataNS is the XML namespace of proxyfleet's element in a domain's
// <metadata>. libvirt has no labels; this element is the ownership mark the
// orphan GC and Create's adoption guard rely on.
const MetadataNS = "https://proxyfleet.io/xmlns/kvm/v1"

// metadataPrefix is the namespace prefix libvirt stores the element under.
const metadataPrefix = "proxyfleet"

// Mark is what proxyfleet records in a domain it made.
type Mark struct {
	// Managed is true on every domain proxyfleet made.
	Managed bool
	// UID is the owning Proxy's UID.
	UID string
	// CreatedAt is when Create defined the domain.
	CreatedAt time.Time
	// Proxy is namespace/name of the owning Proxy, for humans.
	Proxy string
	// Installation is the creating controller's installation ID
	// (providers.CreateRequest.Installation); empty on guests made before
	// installations were tagged.
	Installation string
}

type markXML struct {
	XMLName   xml.Name `xml:"instance"`
	Managed   string   `xml:"managed,attr"`
	UID       string   `xml:"uid,attr"`
	CreatedAt string   `xml:"createdAt,attr"`
	Proxy     string   `xml:"proxy,attr,omitempty"`
	// Installation is the attribute's own name: the GC's proof of whose.
	Installation string `xml:"installation,attr,omitempty"`
}

// renderMark is the element as it sits inside <metadata>, namespaced.
func renderMark(m Mark) string {
	var b strings.Builder
	b.WriteString("<" + metadataPrefix + ":instance xmlns:" + metadataPrefix + "=\"" + MetadataNS + "\"")
	attr := func(k, v string) {
		b.WriteString(" " + k + "=\"")
		_ = xml.EscapeText(&b, []byte(v))
		b.WriteString("\"")
	}
	attr("managed", fmt.Sprint(m.Managed))
	attr("uid", m.UID)
	attr("createdAt", m.CreatedAt.UTC().Format(time.RFC3339))
	if m.Proxy != "" {
		attr("proxy", m.Proxy)
	}
	if m.Installation != "" {
		attr("installation", m.Installation)
	}
	b.WriteString("/>")
	return b.String()
}

// parseMark reads the element DomainGetMetadata returns. libvirt selects it
// by our namespace URI but may hand it back without the namespace
// declaration, so only the local name is matched.
func parseMark(s string) (Mark, error) {
	var m markXML
	if err := xml.Unmarshal([]byte(s), &m); err != nil {
		return Mark{}, fmt.Errorf("reading proxyfleet metadata: %w", err)
	}
	out := Mark{Managed: m.Managed == "true", UID: m.UID, Proxy: m.Proxy, Installation: m.Installation}
	if t, err := time.Parse(time.RFC3339, m.CreatedAt); err == nil {
		out.CreatedAt = t
	}
	return out, nil
}

// domainSpec is everything the domain XML depends on.
type domainSpec struct {
	Name       string
	DomainType string // kvm or qemu
	// CPUMode is host-passthrough (kvm's default when empty), host-model
	// or a CPU model name.
	CPUMode   string
	VCPUs     int
	MemoryMiB int
	// DiskPath and SeedPath are the file paths libvirt reported for the
	// overlay and the seed. Disks are type="file" with these paths, never
	// type="volume": AppArmor's virt-aa-helper grants QEMU only disk
	// sources that carry a path.
	DiskPath string
	SeedPath string
	// Firmware is "uefi" or "bios".
	Firmware string
	// Network or Bridge, exactly one.
	Network string
	Bridge  string
	Mark    Mark
}

// Firmware values.
const (
	FirmwareUEFI = "uefi"
	FirmwareBIOS = "bios"
)

// domainXML renders the domain. UEFI by default, through libvirt's
// firmware autoselection (<os firmware="efi">) with secure boot off, so the
// OVMF path never sits in our config and unsigned images boot; ACPI is on
// because UEFI on x86 requires it. A serial console (current cloud images
// log there) and the guest-agent channel the address lookup uses. The seed
// is a CD-ROM on virtio-scsi, not SATA: distributions' cloud kernels
// (Debian's linux-image-cloud-amd64) leave out the AHCI driver q35's SATA
// needs, and a guest that cannot see its seed boots without its
// cloud-init; every image that runs on Compute Engine has virtio-scsi.
func domainXML(s domainSpec) (string, error) {
	if s.DiskPath == "" || s.SeedPath == "" {
		return "", fmt.Errorf("%w: domain %s: the disk and seed paths are required", providers.ErrPermanent, s.Name)
	}
	if (s.Network == "") == (s.Bridge == "") {
		return "", fmt.Errorf("%w: domain %s: exactly one of network and bridge", providers.ErrPermanent, s.Name)
	}
	esc := func(v string) string {
		var b strings.Builder
		_ = xml.EscapeText(&b, []byte(v))
		return b.String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<domain type=%q>\n", s.DomainType)
	fmt.Fprintf(&b, "  <name>%s</name>\n", esc(s.Name))
	fmt.Fprintf(&b, "  <metadata>%s</metadata>\n", renderMark(s.Mark))
	fmt.Fprintf(&b, "  <memory unit=\"MiB\">%d</memory>\n  <vcpu>%d</vcpu>\n", s.MemoryMiB, s.VCPUs)
	if s.Firmware == FirmwareBIOS {
		b.WriteString("  <os>\n    <type arch=\"x86_64\" machine=\"q35\">hvm</type>\n    <boot dev=\"hd\"/>\n  </os>\n")
	} else {
		b.WriteString("  <os firmware=\"efi\">\n    <type arch=\"x86_64\" machine=\"q35\">hvm</type>\n" +
			"    <firmware><feature enabled=\"no\" name=\"secure-boot\"/></firmware>\n    <boot dev=\"hd\"/>\n  </os>\n")
	}
	b.WriteString("  <features><acpi/><apic/></features>\n")
	b.WriteString(cpuXML(s.DomainType, s.CPUMode))
	b.WriteString("  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n")
	b.WriteString("  <devices>\n")
	fmt.Fprintf(&b, "    <disk type=\"file\" device=\"disk\">\n      <driver name=\"qemu\" type=\"qcow2\"/>\n      <source file=\"%s\"/>\n      <target dev=\"vda\" bus=\"virtio\"/>\n    </disk>\n", esc(s.DiskPath))
	b.WriteString("    <controller type=\"scsi\" index=\"0\" model=\"virtio-scsi\"/>\n")
	fmt.Fprintf(&b, "    <disk type=\"file\" device=\"cdrom\">\n      <driver name=\"qemu\" type=\"raw\"/>\n      <source file=\"%s\"/>\n      <target dev=\"sda\" bus=\"scsi\"/>\n      <readonly/>\n    </disk>\n", esc(s.SeedPath))
	if s.Network != "" {
		fmt.Fprintf(&b, "    <interface type=\"network\">\n      <source network=\"%s\"/>\n      <model type=\"virtio\"/>\n    </interface>\n", esc(s.Network))
	} else {
		fmt.Fprintf(&b, "    <interface type=\"bridge\">\n      <source bridge=\"%s\"/>\n      <model type=\"virtio\"/>\n    </interface>\n", esc(s.Bridge))
	}
	b.WriteString("    <serial type=\"pty\"><target port=\"0\"/></serial>\n    <console type=\"pty\"><target type=\"serial\" port=\"0\"/></console>\n")
	b.WriteString("    <channel type=\"unix\"><target type=\"virtio\" name=\"org.qemu.guest_agent.0\"/></channel>\n")
	b.WriteString("    <rng model=\"virtio\"><backend model=\"random\">/dev/urandom</backend></rng>\n")
	b.WriteString("  </devices>\n</domain>\n")
	return b.String(), nil
}

// cpuXML is the domain's <cpu>: kvm passes the host CPU through unless
// mode says host-model or names a model; a named model is exact and never
// silently replaced by another (fallback forbid), under kvm or qemu; qemu
// without a model gets QEMU's default (no element).
func cpuXML(domainType, mode string) string {
	switch {
	case mode == "" || mode == CPUHostPassthrough:
		if domainType == DomainKVM {
			return "  <cpu mode=\"host-passthrough\"/>\n"
		}
		return ""
	case mode == CPUHostModel:
		return "  <cpu mode=\"host-model\"/>\n"
	}
	var b strings.Builder
	b.WriteString("  <cpu mode=\"custom\" match=\"exact\"><model fallback=\"forbid\">")
	_ = xml.EscapeText(&b, []byte(mode))
	b.WriteString("</model></cpu>\n")
	return b.String()
}

// overlayXML is a qcow2 volume backed by the cached base image.
func overlayXML(name string, capacityBytes uint64, basePath, baseFormat string) string {
	var b strings.Builder
	b.WriteString("<volume type=\"file\"><name>")
	_ = xml.EscapeText(&b, []byte(name))
	fmt.Fprintf(&b, "</name><capacity unit=\"bytes\">%d</capacity><target><format type=\"qcow2\"/></target><backingStore><path>", capacityBytes)
	_ = xml.EscapeText(&b, []byte(basePath))
	fmt.Fprintf(&b, "</path><format type=%q/></backingStore></volume>", baseFormat)
	return b.String()
}

// rawVolumeXML is a sparse raw volume of exactly sizeBytes, filled by an upload.
func rawVolumeXML(name string, sizeBytes uint64) string {
	var b strings.Builder
	b.WriteString("<volume type=\"file\"><name>")
	_ = xml.EscapeText(&b, []byte(name))
	fmt.Fprintf(&b, "</name><capacity unit=\"bytes\">%d</capacity><allocation unit=\"bytes\">0</allocation><target><format type=\"raw\"/></target></volume>", sizeBytes)
	return b.String()
}

// Volume names. The base carries the entry name, so two entries (or two
// provider types) pointing one key at different URLs never share a file.
func baseVolumeName(entry, key, format string) string {
	return "base-" + entry + "-" + key + "." + format
}

// markerVolumeName is the name of a base's marker: the base's name, then
// ".sha256-" and the digest of what was uploaded.
func markerVolumeName(base, digest string) string { return base + markerInfix + digest }

const markerInfix = ".sha256-"

// parseMarkerVolume reads the digest from the name of base's marker; ok
// is false for any other volume.
func parseMarkerVolume(base, vol string) (digest string, ok bool) {
	return strings.CutPrefix(vol, base+markerInfix)
}

func overlayVolumeName(name string) string { return name + ".qcow2" }
func seedVolumeName(name string) string    { return name + "-seed.iso" }

// markSuffix ends the name of a guest's mark volume,
// "<guest>.<owner UID>.<unix seconds>[.i-<installation>].mark": an empty
// volume whose name is the mark (who owns the guest, since when, made by
// which installation), made before anything else of
// the guest and removed after everything else, so the orphan GC can prove
// that an overlay and a seed without a domain are proxyfleet's and whose.
// The name, not content, carries it: listing the pool reads every mark in
// one call, with no download stream per guest.
const markSuffix = ".mark"

// markInstallationPrefix starts the installation's segment of a mark
// volume's name: never all digits, so it cannot be read as the seconds of
// a mark written before installations were tagged.
const markInstallationPrefix = "i-"

func markVolumeName(name string, m Mark) string {
	v := name + "." + m.UID + "." + strconv.FormatInt(m.CreatedAt.Unix(), 10)
	if m.Installation != "" {
		v += "." + markInstallationPrefix + m.Installation
	}
	return v + markSuffix
}

// markUID is what an owner UID may hold to be written into a mark
// volume's name (Kubernetes UIDs are UUIDs).
var markUID = regexp.MustCompile(`^[A-Za-z0-9-]+$`)

// parseMarkVolume reads a mark volume's name; ok is false for any other
// volume.
func parseMarkVolume(vol string) (guest string, m Mark, ok bool) {
	rest, ok := strings.CutSuffix(vol, markSuffix)
	if !ok {
		return "", Mark{}, false
	}
	installation := ""
	if i := strings.LastIndexByte(rest, '.'); i >= 0 && strings.HasPrefix(rest[i+1:], markInstallationPrefix) {
		installation = rest[i+1+len(markInstallationPrefix):]
		if !markUID.MatchString(installation) {
			return "", Mark{}, false
		}
		rest = rest[:i]
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return "", Mark{}, false
	}
	secs, err := strconv.ParseInt(rest[i+1:], 10, 64)
	rest = rest[:i]
	j := strings.LastIndexByte(rest, '.')
	if err != nil || j < 0 || !markUID.MatchString(rest[j+1:]) || !domainName.MatchString(rest[:j]) {
		return "", Mark{}, false
	}
	return rest[:j], Mark{Managed: true, UID: rest[j+1:], CreatedAt: time.Unix(secs, 0).UTC(), Installation: installation}, true
}

// FormatProviderID returns "hosts/<host>/domains/<name>". The host is part
// of the ID, so the hosts list can change without stranding domains. It is
// exported as the one statement of the ID a kvm Proxy's status.providerID
// shows: the controller's and the binary's kvm tests compare against it.
// (The kubernetes and gcp IDs are only read inside their providers.)
func FormatProviderID(host, name string) string {
	return "hosts/" + host + "/domains/" + name
}

// parseProviderID parses FormatProviderID's form strictly; anything else is
// ErrPermanent, since retrying cannot make it parse.
func parseProviderID(id string) (host, name string, err error) {
	parts := strings.Split(id, "/")
	if len(parts) != 4 || parts[0] != "hosts" || parts[2] != "domains" || !identifier.MatchString(parts[1]) || !domainName.MatchString(parts[3]) {
		return "", "", fmt.Errorf("%w: invalid providerID %q: want hosts/<host>/domains/<name>", providers.ErrPermanent, id)
	}
	return parts[1], parts[3], nil
}
