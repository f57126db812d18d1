package node

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// ImageConfig is the run configuration an image archive records.
type ImageConfig struct {
	Entrypoint, Cmd, Env []string
	// User is "uid:gid" (default root).
	User string
}

// WriteImage writes a docker-archive (what `ctr images import` and
// `docker load` read) of a linux/amd64 image named ref whose one layer is
// the uncompressed tar at layerTar, run with cfg. The layer goes in as it
// is: an archive is loaded once, so compressing a root file system of a
// hundred megabytes would only cost time.
func WriteImage(path, ref, layerTar string, cfg ImageConfig) error {
	lf, err := os.Open(layerTar)
	if err != nil {
		return err
	}
	defer lf.Close()
	st, err := lf.Stat()
	if err != nil {
		return err
	}
	h := sha256.New()
	if _, err := io.Copy(h, lf); err != nil {
		return err
	}
	diffID := "sha256:" + hex.EncodeToString(h.Sum(nil))
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC(),
		"config":       map[string]any{"Entrypoint": cfg.Entrypoint, "Cmd": cfg.Cmd, "Env": cfg.Env, "User": cfg.User, "WorkingDir": "/"},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return err
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{"Config": configName, "RepoTags": []string{ref}, "Layers": []string{"layer.tar"}}})
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	add := func(name string, size int64, body io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := io.Copy(tw, body)
		return err
	}
	if _, err := lf.Seek(0, io.SeekStart); err != nil {
		_ = f.Close()
		return err
	}
	for _, step := range []func() error{
		func() error { return add(configName, int64(len(config)), bytes.NewReader(config)) },
		func() error { return add("layer.tar", st.Size(), lf) },
		func() error { return add("manifest.json", int64(len(manifest)), bytes.NewReader(manifest)) },
		tw.Close,
	} {
		if err := step(); err != nil {
			_ = f.Close()
			return fmt.Errorf("image %s: %w", ref, err)
		}
	}
	return f.Close()
}

// PauseImage builds the pause command (static) and an image archive of it
// named PauseImageRef, the node's sandbox image, and returns the
// archive's path.
func PauseImage(t testing.TB) string {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./internal/testkit/node/pause")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node: building the pause command: %v\n%s", err, out)
	}
	layer := filepath.Join(dir, "layer.tar")
	if err := tarFiles(layer, map[string]string{"pause": bin}); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "pause.tar")
	if err := WriteImage(archive, PauseImageRef, layer, ImageConfig{Entrypoint: []string{"/pause"}, User: "65535:65535"}); err != nil {
		t.Fatalf("node: the pause image: %v", err)
	}
	return archive
}

// tarFiles writes a layer tar holding each file (its name in the image:
// its path here), executable.
func tarFiles(path string, files map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for name, src := range files {
		data, err := os.ReadFile(src)
		if err != nil {
			_ = f.Close()
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			_ = f.Close()
			return err
		}
		if _, err := tw.Write(data); err != nil {
			_ = f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// SquidImageRef names the Squid image SquidImage builds.
const SquidImageRef = "proxyfleet.local/squid:dev"

// SquidImage returns an image archive named SquidImageRef of the Squid
// root file system hack/squid-rootfs.sh builds (Debian's squid;
// $PROXYFLEET_SQUID_ROOTFS, else bin/squid-rootfs.tar), failing the test
// with how to build it when it is missing. The image has no entrypoint of
// its own: the kubernetes provider's Pod names /usr/sbin/squid.
func SquidImage(t testing.TB) string {
	t.Helper()
	rootfs := os.Getenv("PROXYFLEET_SQUID_ROOTFS")
	if rootfs == "" {
		root, err := testutil.ModuleRoot()
		if err != nil {
			t.Fatal(err)
		}
		rootfs = filepath.Join(root, "bin", "squid-rootfs.tar")
	}
	if _, err := os.Stat(rootfs); err != nil {
		t.Fatalf("node: the Squid root file system is missing (make squid-rootfs builds bin/squid-rootfs.tar): %v", err)
	}
	archive := filepath.Join(t.TempDir(), "squid.tar")
	if err := WriteImage(archive, SquidImageRef, rootfs, ImageConfig{Cmd: []string{"/usr/sbin/squid", "-N"}}); err != nil {
		t.Fatalf("node: the Squid image: %v", err)
	}
	return archive
}
