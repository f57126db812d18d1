package oci_test

import (
	"archive/tar"
	"debug/buildinfo"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/proxyfleet/proxyfleet/controller/inject"
	"github.com/proxyfleet/proxyfleet/hack/image/internal/oci"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// staticBinary builds cmd/proxyfleet with tags as make image does
// (CGO_ENABLED=0, so it runs on a scratch base).
func staticBinary(t *testing.T, version, tags string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "proxyfleet")
	cmd := exec.Command("go", "build", "-trimpath", "-tags", tags, "-ldflags", "-X main.version="+version, "-o", out, "./cmd/proxyfleet")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// untar unpacks an archive into dir.
func untar(t *testing.T, r io.Reader, dir string, keep func(name string) bool) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if keep != nil && !keep(h.Name) {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestImageArchiveLoadsWithItsEntrypointNonRootUserLabelsAndARunnableBinary(t *testing.T) {
	bin := staticBinary(t, "image-test", "sidecar,nomirror")
	mitmBin := staticBinary(t, "image-test", "sidecar")
	archive := filepath.Join(t.TempDir(), "proxyfleet-sidecar-image.tar")
	const ref = "ghcr.io/proxyfleet/proxyfleet-sidecar:image-test"
	img, err := oci.Build(oci.Options{Binary: bin, MITMBinary: mitmBin, Title: "proxyfleet-sidecar", Version: "image-test", Revision: "abc123",
		Source: "https://github.com/proxyfleet/proxyfleet", Created: time.Unix(1700000000, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if err := oci.WriteArchive(archive, img, ref); err != nil {
		t.Fatal(err)
	}

	// Read it back as any OCI tool would: unpack the archive, open the layout.
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	layoutDir := t.TempDir()
	untar(t, f, layoutDir, nil)
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatalf("the archive is not an OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations[oci.RefAnnotation] != ref {
		t.Fatalf("index manifests %+v, want one named %s", im.Manifests, ref)
	}
	loaded, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := loaded.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cf.Config.Entrypoint, " "); got != "/proxyfleet" {
		t.Errorf("entrypoint %q, want /proxyfleet", got)
	}
	if u := cf.Config.User; u == "" || u == "0" || strings.HasPrefix(u, "0:") || u == "root" {
		t.Errorf("user %q: the image must not run as root", u)
	}
	if cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.title": "proxyfleet-sidecar", "org.opencontainers.image.version": "image-test",
		"org.opencontainers.image.revision": "abc123", "org.opencontainers.image.created": "2023-11-14T22:13:20Z",
	} {
		if got := cf.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}

	// The layer holds the binary (executable), the CA roots and passwd; the
	// binary runs.
	rc := onlyLayer(t, loaded)
	defer rc.Close()
	rootfs := t.TempDir()
	untar(t, rc, rootfs, nil)
	for _, p := range []string{"etc/ssl/certs/ca-certificates.crt", "etc/passwd", "etc/group"} {
		if fi, err := os.Stat(filepath.Join(rootfs, p)); err != nil || fi.Size() == 0 {
			t.Errorf("%s missing or empty in the layer: %v", p, err)
		}
	}
	if passwd, _ := os.ReadFile(filepath.Join(rootfs, "etc/passwd")); !strings.Contains(string(passwd), ":65532:65532:") {
		t.Errorf("/etc/passwd has no entry for the image's user: %s", passwd)
	}
	// Both binaries run, the one the webhook runs for MITM pods at the
	// path it names, and only that one mirrors.
	for path, mirrors := range map[string]bool{oci.Entrypoint: false, oci.MITMEntrypoint: true} {
		p := filepath.Join(rootfs, path[1:])
		out, err := exec.Command(p, "version").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "proxyfleet image-test" {
			t.Fatalf("%s version from the layer: %q %v", path, out, err)
		}
		if got := buildTags(t, p); slices.Contains(got, "nomirror") == mirrors {
			t.Errorf("%s is built with the tags %v: want it to mirror: %v", path, got, mirrors)
		}
	}
	if oci.MITMEntrypoint != inject.MITMCommand {
		t.Errorf("the image has the MITM binary at %s, the injection webhook runs %s", oci.MITMEntrypoint, inject.MITMCommand)
	}
}

// TestTheFullImageLinksTheMITMPathToItsOneBinary: the full image (no
// MITMBinary) holds MITMEntrypoint as a link to the binary, so a webhook
// pointed at it (--gateway-image) runs MITM pods' sidecars too.
func TestTheFullImageLinksTheMITMPathToItsOneBinary(t *testing.T) {
	img, err := oci.Build(oci.Options{Binary: "/proc/self/exe"})
	if err != nil {
		t.Fatal(err)
	}
	rc := onlyLayer(t, img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no %s in the layer: %v", oci.MITMEntrypoint, err)
		}
		if "/"+h.Name == oci.MITMEntrypoint {
			if h.Typeflag != tar.TypeSymlink || h.Linkname != oci.Entrypoint[1:] {
				t.Fatalf("%s: type %c, link %q; want a link to %s", oci.MITMEntrypoint, h.Typeflag, h.Linkname, oci.Entrypoint[1:])
			}
			return
		}
	}
}

// onlyLayer is the image's one layer, uncompressed.
func onlyLayer(t *testing.T, img v1.Image) io.ReadCloser {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d %v, want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// buildTags are the build tags Go recorded in binary.
func buildTags(t *testing.T, binary string) []string {
	t.Helper()
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range bi.Settings {
		if s.Key == "-tags" {
			return strings.Split(s.Value, ",")
		}
	}
	return nil
}

func TestImageBuildNamesWhatIsMissing(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    oci.Options
		want string
	}{
		{"no binary", oci.Options{}, "no binary"},
		{"a binary that is not there", oci.Options{Binary: "/nonexistent/proxyfleet"}, "binary"},
		{"a MITM binary that is not there", oci.Options{Binary: "/proc/self/exe", MITMBinary: "/nonexistent/proxyfleet-mitm"}, "MITM binary"},
		{"CA roots that are not there", oci.Options{Binary: "/proc/self/exe", CABundle: "/nonexistent/ca.crt"}, "CA roots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := oci.Build(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
