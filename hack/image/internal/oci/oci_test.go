package oci_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/proxyfleet/proxyfleet/hack/image/internal/oci"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// staticBinary builds the sidecar flavour of cmd/proxyfleet as make image
// does (CGO_ENABLED=0, so it runs on a scratch base).
func staticBinary(t *testing.T, version string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "proxyfleet")
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "sidecar", "-ldflags", "-X main.version="+version, "-o", out, "./cmd/proxyfleet")
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
	bin := staticBinary(t, "image-test")
	archive := filepath.Join(t.TempDir(), "proxyfleet-sidecar-image.tar")
	const ref = "ghcr.io/proxyfleet/proxyfleet-sidecar:image-test"
	img, err := oci.Build(oci.Options{Binary: bin, Title: "proxyfleet-sidecar", Version: "image-test", Revision: "abc123",
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
	layers, err := loaded.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d %v, want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
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
	out, err := exec.Command(filepath.Join(rootfs, "proxyfleet"), "version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "proxyfleet image-test" {
		t.Fatalf("/proxyfleet version from the layer: %q %v", out, err)
	}
}

func TestImageBuildNamesWhatIsMissing(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    oci.Options
		want string
	}{
		{"no binary", oci.Options{}, "no binary"},
		{"a binary that is not there", oci.Options{Binary: "/nonexistent/proxyfleet"}, "binary"},
		{"CA roots that are not there", oci.Options{Binary: "/proc/self/exe", CABundle: "/nonexistent/ca.crt"}, "CA roots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := oci.Build(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
