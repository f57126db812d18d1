package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// sidecarDenied are module and package paths the sidecar build (make
// sidecar, -tags sidecar) must not link, each with the reason; a path
// matches itself and everything under it. docs/injection.md lists what
// the sidecar leaves out and why.
var sidecarDenied = map[string]string{
	"k8s.io/client-go":                                              "the controller's Kubernetes client",
	"k8s.io/apimachinery":                                           "the Kubernetes API machinery and its registered types",
	"k8s.io/api":                                                    "the Kubernetes API types",
	"sigs.k8s.io/controller-runtime":                                "the controller",
	"github.com/redis/go-redis":                                     "the Redis lease store (a sidecar leases through --lease-api)",
	"google.golang.org/grpc":                                        "the gRPC stack (OTLP over gRPC; the sidecar exports OTLP over HTTP)",
	"google.golang.org/genproto":                                    "gRPC's generated Google API types",
	"github.com/grpc-ecosystem/grpc-gateway":                        "the OTLP collector service's gRPC gateway",
	"go.opentelemetry.io/proto/otlp":                                "the generated OTLP packages (the sidecar writes OTLP with protowire)",
	"go.opentelemetry.io/otel/exporters/otlp":                       "go.opentelemetry.io's OTLP exporters, which link gRPC",
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp": "otelhttp and httpsnoop (the sidecar's span middleware is its own)",
	"github.com/prometheus/client_golang":                           "Prometheus' client and its protobuf data model (the sidecar serves /metrics with internal/promlite)",
	"github.com/prometheus/client_model":                            "Prometheus' protobuf data model",
	"google.golang.org/protobuf/proto":                              "the protobuf runtime (the sidecar writes OTLP with protowire alone)",
	"github.com/cpuguy83/go-md2man":                                 "the CLI library's man-page writer (urfave_cli_no_docs), which nothing calls",
	"github.com/russross/blackfriday":                               "the Markdown parser under the man-page writer",
}

// mirrorDenied are what the lean sidecar (bin/proxyfleet-sidecar, the
// sidecar image's entrypoint, -tags nomirror) leaves out beside
// sidecarDenied: ClientHello mirroring, which only a pod with a MITM CA
// can use; such pods run the sidecar image's /proxyfleet-mitm.
var mirrorDenied = map[string]string{
	"github.com/bogdanfinn/utls":    "uTLS, the mirrored ClientHello (the lean sidecar has no MITM CA to use it with)",
	"github.com/bogdanfinn/fhttp":   "fhttp, the HTTP/2 client that writes a client's frames to sites",
	"github.com/cloudflare/circl":   "circl, uTLS's post-quantum and signature schemes",
	"github.com/klauspost/compress": "klauspost/compress, under fhttp",
	"github.com/andybalholm/brotli": "brotli, uTLS's certificate compression",
	"golang.org/x/net/http2":        "x/net's HTTP/2, which reads a client's first frames for mirroring",
}

// sidecarBuild is one build of the sidecar and what it must not link.
type sidecarBuild struct {
	// name is the binary make sidecar writes; tags are its build tags.
	name, tags string
	// makeLine and dockerLine are what the Makefile and the Dockerfile
	// hold when they build it with tags.
	makeLine, dockerLine string
	denied               []map[string]string
	// maxPackages bounds its dependency graph: a new dependency that pushes
	// it over is a decision to make in review, with its cost measured, not
	// something that creeps in.
	maxPackages int
}

// sidecarBuilds are the two sidecar binaries. The lean one had 299
// packages when mirroring left it (385 with it; 291 before mirroring came,
// whose uTLS, circl, fhttp and klauspost/compress added 96, for 4.3 MB of
// binary); docs/performance.md measures both. The gateway's stages moving
// into packages of their own added 8 of ours (303 → 311, 392 → 400) and
// 20 KiB of each stripped binary, no code and no dependency; later three more of ours
// (internal/clustertargets, gateway/pacing, gateway/answerbody: 311 → 314),
// again no dependency, and internal/ascii (314 → 315, 403 → 404): the one
// ASCII case fold of field names, 30 lines that replaced four copies;
// gateway/tiering (315 → 316, 404 → 405), the tier stage, no dependency;
// gateway/clients and pool/quota (316 → 318, 405 → 407), the token
// clients' lines and their quotas' pure policy, no dependency.
var sidecarBuilds = []sidecarBuild{
	{name: "proxyfleet-sidecar", tags: "sidecar,nomirror,urfave_cli_no_docs",
		makeLine: "SIDECAR_TAGS := sidecar,nomirror,urfave_cli_no_docs\n", dockerLine: `TAGS="${TAGS},nomirror,urfave_cli_no_docs"`,
		denied: []map[string]string{sidecarDenied, mirrorDenied}, maxPackages: 318},
	{name: "proxyfleet-sidecar-mitm", tags: "sidecar,urfave_cli_no_docs",
		makeLine: "SIDECAR_MITM_TAGS := sidecar,urfave_cli_no_docs\n", dockerLine: `mitm_tags="${TAGS},urfave_cli_no_docs"`,
		denied: []map[string]string{sidecarDenied}, maxPackages: 407},
}

// TestSidecarLinksNoDeniedPackage: `go list -deps -tags TAGS
// ./cmd/proxyfleet` of each sidecar build holds nothing on its deny-lists
// and stays under its package budget, so the sidecar's footprint cannot
// grow back unnoticed; and the Makefile and the Dockerfile build each with
// those tags.
func TestSidecarLinksNoDeniedPackage(t *testing.T) {
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	under := func(p, denied string) bool { return p == denied || strings.HasPrefix(p, denied+"/") }
	for _, b := range sidecarBuilds {
		t.Run(b.name, func(t *testing.T) {
			if !strings.Contains(string(makefile), b.makeLine) {
				t.Errorf("the Makefile does not build %s with the tags this test checks: want %q in it", b.name, b.makeLine)
			}
			if !strings.Contains(string(dockerfile), b.dockerLine) {
				t.Errorf("the Dockerfile does not build %s with the tags this test checks: want %q in it", b.name, b.dockerLine)
			}
			out, err := exec.Command("go", "list", "-deps", "-tags", b.tags, ".").Output()
			if err != nil {
				t.Fatalf("go list -deps -tags %s: %v", b.tags, err)
			}
			pkgs := strings.Fields(string(out))
			for _, list := range b.denied {
				for denied, why := range list {
					var linked []string
					for _, p := range pkgs {
						if under(p, denied) {
							linked = append(linked, p)
						}
					}
					if len(linked) > 0 {
						t.Errorf("%s links %d package(s) under %s (%s), which is denied there: %s; `go list -deps -tags %s -f '{{.ImportPath}}: {{.Imports}}' ./cmd/proxyfleet` shows who imports them",
							b.name, len(linked), denied, why, strings.Join(linked[:min(len(linked), 3)], ", "), b.tags)
					}
				}
			}
			if len(pkgs) > b.maxPackages {
				t.Errorf("%s links %d packages, over its budget of %d: measure the new ones' cost (make bench) and raise maxPackages in the same change if it is worth it",
					b.name, len(pkgs), b.maxPackages)
			}
		})
	}
	// The full build still links what the sidecars leave out: the lists
	// above name packages that exist, not misspellings.
	full, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, list := range []map[string]string{sidecarDenied, mirrorDenied} {
		for denied := range list {
			if !slices.ContainsFunc(strings.Fields(string(full)), func(p string) bool { return under(p, denied) }) {
				t.Errorf("the full build does not link %s either: a stale or misspelt deny-list entry", denied)
			}
		}
	}
}
