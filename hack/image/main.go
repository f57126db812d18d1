// Command image writes proxyfleet's OCI image tarballs (make image) with
// its internal/oci: no Docker engine needed.
//
//	go run ./hack/image --binary bin/static/proxyfleet --out bin/proxyfleet-image.tar --ref ghcr.io/proxyfleet/proxyfleet:v1
//
// It imports its own internal/oci only; nothing the proxyfleet binary is
// built from imports go-containerregistry.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/proxyfleet/proxyfleet/hack/image/internal/oci"
)

func main() {
	var o oci.Options
	var out, created string
	flag.StringVar(&o.Binary, "binary", "", "static proxyfleet `FILE` (CGO_ENABLED=0) to ship")
	flag.StringVar(&o.MITMBinary, "mitm-binary", "", "static `FILE` shipped at "+oci.MITMEntrypoint+", what the injection webhook runs for MITM pods (default: a link to the binary)")
	flag.StringVar(&out, "out", "", "OCI archive `FILE` to write")
	flag.StringVar(&o.Ref, "ref", "", "image reference recorded in the archive")
	flag.StringVar(&o.Title, "title", "proxyfleet", "OCI title label")
	flag.StringVar(&o.Description, "description", "", "OCI description label")
	flag.StringVar(&o.Version, "version", "dev", "OCI version label")
	flag.StringVar(&o.Revision, "revision", "", "OCI revision label (the commit)")
	flag.StringVar(&o.Source, "source", "https://github.com/proxyfleet/proxyfleet", "OCI source label")
	flag.StringVar(&o.CABundle, "ca-bundle", oci.CABundle, "PEM `FILE` of CA roots to copy in")
	flag.StringVar(&created, "created", "", "creation time as Unix seconds (the commit time keeps builds reproducible; default 0)")
	flag.Parse()
	if o.Binary == "" || out == "" {
		fmt.Fprintln(os.Stderr, "image: --binary and --out are required")
		os.Exit(2)
	}
	if created != "" {
		sec, err := strconv.ParseInt(created, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "image: --created %q: want Unix seconds\n", created)
			os.Exit(2)
		}
		o.Created = time.Unix(sec, 0)
	} else {
		o.Created = time.Unix(0, 0)
	}
	img, err := oci.Build(o)
	if err == nil {
		err = oci.WriteArchive(out, img, o.Ref)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	d, _ := img.Digest()
	fmt.Printf("wrote %s (%s, %s)\n", out, o.Ref, d)
}
