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

// CrawlerImageRef names the crawler image CrawlerImage builds.
const CrawlerImageRef = "proxyfleet.local/crawler:dev"

// SquidImage returns an image archive named SquidImageRef of the Squid
// root file system `hack/rootfs.sh squid` builds (Debian's squid;
// $PROXYFLEET_SQUID_ROOTFS, else bin/squid-rootfs.tar). It has no
// entrypoint of its own: the kubernetes provider's Pod names
// /usr/sbin/squid.
func SquidImage(t testing.TB) string {
	t.Helper()
	return rootfsImage(t, SquidImageRef, "PROXYFLEET_SQUID_ROOTFS", "squid-rootfs.tar", "make squid-rootfs", ImageConfig{Cmd: []string{"/usr/sbin/squid", "-N"}})
}

// CrawlerImage returns an image archive named CrawlerImageRef of the
// crawler root file system `hack/rootfs.sh crawler` builds (Debian's curl,
// python3 and python3-requests; $PROXYFLEET_CRAWLER_ROOTFS, else
// bin/crawler-rootfs.tar).
func CrawlerImage(t testing.TB) string {
	t.Helper()
	return rootfsImage(t, CrawlerImageRef, "PROXYFLEET_CRAWLER_ROOTFS", "crawler-rootfs.tar", "make crawler-rootfs",
		ImageConfig{Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}})
}

// rootfsImage writes an image archive named ref of the root file system
// tar at $env (else bin/file), failing the test with the make target that
// builds it when it is missing.
func rootfsImage(t testing.TB, ref, env, file, target string, cfg ImageConfig) string {
	t.Helper()
	rootfs := os.Getenv(env)
	if rootfs == "" {
		root, err := testutil.ModuleRoot()
		if err != nil {
			t.Fatal(err)
		}
		rootfs = filepath.Join(root, "bin", file)
	}
	if _, err := os.Stat(rootfs); err != nil {
		t.Fatalf("node: the root file system of %s is missing (%s builds bin/%s): %v", ref, target, file, err)
	}
	archive := filepath.Join(t.TempDir(), "image.tar")
	if err := WriteImage(archive, ref, rootfs, cfg); err != nil {
		t.Fatalf("node: the image %s: %v", ref, err)
	}
	return archive
}
