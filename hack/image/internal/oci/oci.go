// Package oci writes proxyfleet's container images without a Docker
// engine (none is here, and none is needed): a scratch base, one static
// binary, the build machine's CA roots, a non-root user, the binary as the
// entrypoint and OCI labels, as an OCI image layout packed in a tar
// ("oci-archive": podman load, skopeo copy oci-archive:..., crane, ctr import).
// The Dockerfile at the repository root builds the same image with Docker.
//
// It is hack/image's alone (make image), internal to it so that nothing
// the binary is built from can reach go-containerregistry, and it imports
// nothing of ours.
package oci

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Paths and identity inside the image.
const (
	// Entrypoint is where the binary lives and what runs.
	Entrypoint = "/proxyfleet"
	// MITMEntrypoint is the binary the injection webhook runs for a pod
	// with a MITM CA (controller/inject's MITMCommand): in the sidecar
	// image the build with ClientHello mirroring, which the one at
	// Entrypoint leaves out; in the full image a link to Entrypoint, whose
	// binary has everything.
	MITMEntrypoint = "/proxyfleet-mitm"
	// CABundle is where Go (and OpenSSL) look for the system roots.
	CABundle = "/etc/ssl/certs/ca-certificates.crt"
	// UID and GID are the non-root user (the chart and the sidecar run as it).
	UID = 65532
	GID = 65532
	// RefAnnotation names the image in the layout's index (its tag).
	RefAnnotation = "org.opencontainers.image.ref.name"
)

// Options describe one image.
type Options struct {
	// Binary is the static proxyfleet binary to ship (CGO_ENABLED=0).
	Binary string
	// MITMBinary is shipped at MITMEntrypoint; empty: MITMEntrypoint is a
	// symbolic link to Entrypoint.
	MITMBinary string
	// CABundle is the PEM file of CA roots copied in (default the build
	// machine's /etc/ssl/certs/ca-certificates.crt).
	CABundle string
	// Title, Description, Version, Revision and Source become OCI labels.
	Title, Description, Version, Revision, Source string
	// Created is the image's creation time (a commit's time keeps builds
	// reproducible); zero is the Unix epoch.
	Created time.Time
	// Ref is the tag recorded in the index (org.opencontainers.image.ref.name).
	Ref string
	// Arch is the binary's architecture (default runtime.GOARCH).
	Arch string
}

// Build assembles the image.
func Build(o Options) (v1.Image, error) {
	if o.Binary == "" {
		return nil, errors.New("image: no binary")
	}
	if o.CABundle == "" {
		o.CABundle = CABundle
	}
	if o.Arch == "" {
		o.Arch = runtime.GOARCH
	}
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("image: binary: %w", err)
	}
	var mitmBin []byte
	if o.MITMBinary != "" {
		if mitmBin, err = os.ReadFile(o.MITMBinary); err != nil {
			return nil, fmt.Errorf("image: MITM binary: %w", err)
		}
	}
	roots, err := os.ReadFile(o.CABundle)
	if err != nil {
		return nil, fmt.Errorf("image: CA roots: %w", err)
	}
	layerTar, err := rootfs(bin, mitmBin, roots, o.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		"org.opencontainers.image.title":       o.Title,
		"org.opencontainers.image.description": o.Description,
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Revision,
		"org.opencontainers.image.source":      o.Source,
		"org.opencontainers.image.created":     o.Created.UTC().Format(time.RFC3339),
	}
	for k, v := range labels {
		if v == "" {
			delete(labels, k)
		}
	}
	cfg := v1.Config{
		Entrypoint: []string{Entrypoint},
		User:       strconv.Itoa(UID) + ":" + strconv.Itoa(GID),
		WorkingDir: "/",
		Env:        []string{"SSL_CERT_FILE=" + CABundle},
		Labels:     labels,
	}
	// The appended layer set RootFS (its diff ID); keep it, set the rest.
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Config, cf.Created = o.Arch, "linux", cfg, v1.Time{Time: o.Created.UTC()}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the one layer: the binary, the MITM binary (nil: a link to
// the binary), the CA roots, and passwd/group entries naming the non-root
// user (tools that print user names want them).
func rootfs(bin, mitmBin, roots []byte, mod time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: mod, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: mod, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	steps := []func() error{
		func() error { return dir("etc/") },
		func() error { return dir("etc/ssl/") },
		func() error { return dir("etc/ssl/certs/") },
		func() error { return file("etc/ssl/certs/ca-certificates.crt", 0o644, roots) },
		func() error {
			return file("etc/passwd", 0o644, fmt.Appendf(nil, "root:x:0:0:root:/:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/:/sbin/nologin\n", UID, GID))
		},
		func() error { return file("etc/group", 0o644, fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", GID)) },
		func() error { return file(Entrypoint[1:], 0o755, bin) },
		func() error {
			if mitmBin != nil {
				return file(MITMEntrypoint[1:], 0o755, mitmBin)
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: MITMEntrypoint[1:], Linkname: Entrypoint[1:], Mode: 0o777, ModTime: mod, Format: tar.FormatPAX})
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, fmt.Errorf("image: layer tar: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteArchive writes img as an OCI layout packed into the tar file path.
func WriteArchive(path string, img v1.Image, ref string) error {
	tmp, err := os.MkdirTemp("", "proxyfleet-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	lp, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("image: OCI layout: %w", err)
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{RefAnnotation: ref}))
	}
	if err := lp.AppendImage(img, opts...); err != nil {
		return fmt.Errorf("image: OCI layout: %w", err)
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	walkErr := filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == tmp {
			return err
		}
		rel, _ := filepath.Rel(tmp, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name, hdr.ModTime, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = filepath.ToSlash(rel), time.Unix(0, 0), 0, 0, "", ""
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err := errors.Join(walkErr, tw.Close(), out.Close()); err != nil {
		return fmt.Errorf("image: writing %s: %w", path, err)
	}
	return nil
}
