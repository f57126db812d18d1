package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"
)

// KVMHost is a real libvirtd reached over a real sshd, with a small qcow2
// base image served over HTTP: what a kvm provider entry needs, for tests
// that run the provider through the controller (in process or the binary).
type KVMHost struct {
	Libvirtd *Libvirtd
	SSHD     *SSHD
	// Config is a providers config file's YAML with one kvm entry,
	// "kvm-local", whose host "local" is this libvirtd and whose defaults
	// (image "tiny", machine type "small") make a Managed Proxy need no
	// placement.
	Config string
}

// StartKVMHost starts the libvirtd, the sshd and the image server for the
// test; all stop at cleanup.
func StartKVMHost(t testing.TB) *KVMHost {
	t.Helper()
	lvd := StartLibvirtd(t)
	sshd := StartSSHD(t)
	image := QemuImgCreate(t, filepath.Join(t.TempDir(), "tiny.qcow2"), "64M")
	sum := sha256.Sum256(image)
	images := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(image)))
		_, _ = w.Write(image)
	}))
	t.Cleanup(images.Close)
	cfg := `providers:
  - name: kvm-local
    type: kvm
    kvm:
      ssh: {user: ` + sshd.User + `, privateKeyFile: ` + sshd.KeyFile + `, knownHostsFile: ` + sshd.KnownHostsFile + `, socket: ` + lvd.Socket + `}
      hosts: [{name: local, address: "` + sshd.Addr + `", pool: ` + lvd.PoolName + `, network: ` + lvd.Network + `}]
      images: {tiny: {url: "` + images.URL + `/tiny.qcow2", sha256: ` + hex.EncodeToString(sum[:]) + `}}
      machineTypes: {small: {vcpus: 1, memoryMiB: 256, diskGiB: 1}}
      defaults: {zone: local, image: tiny, machineType: small}
      domainType: ` + lvd.DomainType + `
`
	return &KVMHost{Libvirtd: lvd, SSHD: sshd, Config: cfg}
}

// CachedBaseFiles are the pool's files once every guest is gone: the
// cached base image of kvm-local's "tiny" and its digest marker.
var CachedBaseFiles = []string{"base-kvm-local-tiny.qcow2", "base-kvm-local-tiny.qcow2.sha256"}
