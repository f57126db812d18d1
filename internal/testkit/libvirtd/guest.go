package libvirtd

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers/nocloud"
)

// BootSeeded boots the bootable guest image at imagePath as domain name on
// d's network, with user-data as its NoCloud seed: what a cloud that is not
// libvirt does with the same image and user-data (Compute Engine hands the
// user-data key of its metadata to cloud-init). The overlay and the seed
// live in d's pool directory; the domain dies with the libvirtd.
func (d *Daemon) BootSeeded(t testing.TB, name, imagePath string, userData []byte) {
	t.Helper()
	overlay := filepath.Join(d.PoolDir, name+"-test.qcow2")
	if out, err := exec.Command("/usr/bin/qemu-img", "create", "-q", "-f", "qcow2", "-b", imagePath, "-F", "qcow2", overlay, "3G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}
	iso, err := nocloud.BuildISO(nocloud.Seed{InstanceID: name, Hostname: name, UserData: userData})
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(d.PoolDir, name+"-test-seed.iso")
	if err := os.WriteFile(seed, iso, 0o644); err != nil {
		t.Fatal(err)
	}
	lv := d.Connect(t)
	defer func() { _ = lv.Disconnect() }()
	dom, err := lv.DomainDefineXMLFlags(fmt.Sprintf(`<domain type=%q><name>%s</name><memory unit="MiB">512</memory><vcpu>1</vcpu>
<os firmware="efi"><type arch="x86_64" machine="q35">hvm</type><firmware><feature enabled="no" name="secure-boot"/></firmware><boot dev="hd"/></os>
<features><acpi/><apic/></features>
<devices>
<disk type="file" device="disk"><driver name="qemu" type="qcow2"/><source file=%q/><target dev="vda" bus="virtio"/></disk>
<controller type="scsi" index="0" model="virtio-scsi"/>
<disk type="file" device="cdrom"><driver name="qemu" type="raw"/><source file=%q/><target dev="sda" bus="scsi"/><readonly/></disk>
<interface type="network"><source network=%q/><model type="virtio"/></interface>
<serial type="pty"><target port="0"/></serial><console type="pty"><target type="serial" port="0"/></console>
<rng model="virtio"><backend model="random">/dev/urandom</backend></rng>
</devices></domain>`, d.DomainType, name, overlay, seed, d.Network), 0)
	if err != nil {
		t.Fatalf("defining the guest %s: %v", name, err)
	}
	if err := lv.DomainCreate(dom); err != nil {
		t.Fatalf("starting the guest %s: %v\n%s", name, err, d.GuestReport(name))
	}
}

// LeasedAddr waits up to timeout for the DHCP lease of domain name and
// returns its IPv4 address; the failure carries why.
func (d *Daemon) LeasedAddr(t testing.TB, name string, timeout time.Duration) string {
	t.Helper()
	lv := d.Connect(t)
	defer func() { _ = lv.Disconnect() }()
	var addr string
	err := poll.Wait(timeout, "the DHCP lease of "+name, func() error {
		dom, err := lv.DomainLookupByName(name)
		if err != nil {
			return err
		}
		ifaces, err := lv.DomainInterfaceAddresses(dom, uint32(libvirt.DomainInterfaceAddressesSrcLease), 0)
		if err != nil {
			return err
		}
		for _, ifc := range ifaces {
			for _, a := range ifc.Addrs {
				if ip, err := netip.ParseAddr(a.Addr); err == nil && ip.Is4() {
					addr = ip.String()
					return nil
				}
			}
		}
		return fmt.Errorf("no lease for %s yet", name)
	})
	if err != nil {
		t.Fatalf("the guest %s got no address by DHCP within %s: %v\n%s", name, timeout, err, d.GuestReport(name))
	}
	return addr
}
