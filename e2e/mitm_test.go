package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

const hdrAttempts = "X-Proxyfleet-Attempts"

// mitmSetup is a real gateway in MITM mode (its CA written by `proxyfleet
// mitm-ca init`) over two real Squids, and one TLS site per client so each
// client's ban cools a Squid down for its own site only.
type mitmSetup struct {
	g       *gatewayProc
	caFile  string
	caSPKI  string // base64 SHA-256 of the CA's SubjectPublicKeyInfo
	squids  []*squid.Squid
	sources map[string]bool
	// bin and baseArgs start more gateways like g (startGateway).
	bin      string
	baseArgs []string
}

func startMITMSetup(t *testing.T, sites ...*testutil.Target) *mitmSetup {
	t.Helper()
	var pems [][]byte
	for _, s := range sites {
		pems = append(pems, s.CertPEM())
	}
	return startMITMSetupWith(t, "mitm", []string{"127.0.0.111", "127.0.0.112"}, nil, pems...)
}

// startMITMSetupWith is startMITMSetup with Squids of its own name,
// outgoing addresses and access rules (squid.Options.AccessFirst),
// and the sites' certificates.
func startMITMSetupWith(t *testing.T, name string, squidAddrs, squidAccess []string, sitePEMs ...[]byte) *mitmSetup {
	t.Helper()
	bin := testutil.BuildBinary(t)
	dir := t.TempDir()
	caFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	out, err := exec.Command(bin, "mitm-ca", "init", "--cert", caFile, "--key", keyFile, "--common-name", "proxyfleet e2e CA").CombinedOutput()
	if err != nil {
		t.Fatalf("mitm-ca init: %v\n%s", err, out)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	spki := base64.StdEncoding.EncodeToString(sum[:])
	if !strings.Contains(string(out), spki) {
		t.Fatalf("mitm-ca init did not print the CA's SPKI hash %s:\n%s", spki, out)
	}
	upstreamCA := filepath.Join(dir, "sites.pem")
	writeFile(t, upstreamCA, string(bytes.Join(sitePEMs, nil)))
	opts := make([]squid.Options, len(squidAddrs))
	for i, a := range squidAddrs {
		opts[i] = squid.Options{Name: fmt.Sprintf("%s-%d", name, i), OutgoingAddr: a, AccessFirst: squidAccess}
	}
	squids := squid.StartAll(t, opts...)
	m := &mitmSetup{caFile: caFile, caSPKI: spki, squids: squids, sources: map[string]bool{},
		bin: bin, baseArgs: []string{"--mitm-ca-cert", caFile, "--mitm-ca-key", keyFile, "--upstream-ca-file", upstreamCA, "--log-level", "debug"}}
	for _, a := range squidAddrs {
		m.sources[a] = true
	}
	m.g = m.startGateway(t)
	return m
}

// startGateway starts another gateway over the setup's Squids with its
// CA, with extra flags.
func (m *mitmSetup) startGateway(t *testing.T, args ...string) *gatewayProc {
	t.Helper()
	g := startGateway(t, m.bin, gwConfig{upstreams: squidURLs(m.squids), args: append(slices.Clone(m.baseArgs), args...)})
	if strings.Contains(g.Output(), "PRIVATE KEY") {
		t.Fatal("the gateway logged its CA key")
	}
	return g
}

// wantRetried checks that site saw path first refused (429) through one
// Squid, then served through the other.
func (m *mitmSetup) wantRetried(t *testing.T, site *testutil.Target, path string) {
	t.Helper()
	var got []string
	for _, r := range site.Requests() {
		if r.URI == path {
			got = append(got, fmt.Sprintf("%d via %s", r.Status, r.Source))
		}
	}
	reqs := site.Requests()
	var seen []testutil.SeenRequest
	for _, r := range reqs {
		if r.URI == path {
			seen = append(seen, r)
		}
	}
	if len(seen) != 2 || seen[0].Status != 429 || seen[1].Status != 200 || seen[0].Source == seen[1].Source ||
		!m.sources[seen[0].Source] || !m.sources[seen[1].Source] {
		t.Fatalf("the site saw %s %v; want a 429 through one Squid, then a 200 through the other", path, got)
	}
}

// pageSite is a TLS site whose path answers its first request with a 429.
func pageSite(t *testing.T, host, path string) *testutil.Target {
	t.Helper()
	s := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: host})
	s.SetPathRule(path, 1, http.StatusTooManyRequests, map[string]string{"Retry-After": "120"}, "")
	return s
}

// TestMITMRealClients: curl, Python requests, Node and headless Chromium,
// each trusting the gateway's CA the way docs/mitm.md says, load a page
// over HTTPS through the MITM gateway and two real Squids. The site answers
// each page's first request with a 429, so each client gets the answer the
// gateway retried on the other Squid, and says so in X-Proxyfleet-Attempts.
func TestMITMRealClients(t *testing.T) {
	curlSite := pageSite(t, "127.0.0.121", "/curl")
	pySite := pageSite(t, "127.0.0.122", "/py")
	nodeSite := pageSite(t, "127.0.0.123", "/node")
	chromeSite := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.124", Pages: map[string]string{"/": attemptsPage}})
	chromeSite.SetPathRule("/", 1, http.StatusTooManyRequests, map[string]string{"Retry-After": "120"}, "")
	m := startMITMSetup(t, curlSite, pySite, nodeSite, chromeSite)
	cleanEnv := []string{"PATH=/usr/bin:/bin:" + os.Getenv("PATH"), "HOME=" + t.TempDir()}

	t.Run("curl --cacert", func(t *testing.T) {
		out := run(t, cleanEnv, "curl", "-sS", "--max-time", "30", "--cacert", m.caFile, "-x", "http://"+m.g.addr,
			"-D", "-", curlSite.URL()+"/curl")
		if !strings.HasPrefix(out, "HTTP/1.1 200") || !hasHeader(out, hdrAttempts, "2") || !strings.Contains(out, `"path":"/curl"`) {
			t.Fatalf("curl got:\n%s\nwant the retried 200 with %s: 2", out, hdrAttempts)
		}
		m.wantRetried(t, curlSite, "/curl")
	})

	t.Run("Python requests with REQUESTS_CA_BUNDLE", func(t *testing.T) {
		py := pythonWith(t, "requests")
		script := `import os, requests
p = os.environ["GW"]
r = requests.get(os.environ["URL"], proxies={"http": p, "https": p}, timeout=30)
print(r.status_code, r.headers.get("X-Proxyfleet-Attempts"), r.json()["path"])`
		out := run(t, append(cleanEnv, "REQUESTS_CA_BUNDLE="+m.caFile, "GW=http://"+m.g.addr, "URL="+pySite.URL()+"/py"), py, "-c", script)
		if strings.TrimSpace(out) != "200 2 /py" {
			t.Fatalf("python printed %q, want \"200 2 /py\"", out)
		}
		m.wantRetried(t, pySite, "/py")
	})

	t.Run("Node with NODE_EXTRA_CA_CERTS", func(t *testing.T) {
		node, err := exec.LookPath("node")
		if err != nil {
			t.Fatalf("node not found (make test installs Debian's nodejs with hack/install-deps.sh): %v", err)
		}
		// Node 20 has no proxy support of its own: CONNECT by hand, then
		// TLS over the tunnel with the default CA store (which
		// NODE_EXTRA_CA_CERTS extends).
		script := `const http = require("http"), https = require("https"), tls = require("tls");
const [gwHost, gwPort] = process.env.GW.split(":"); const u = new URL(process.env.URL);
http.request({host: gwHost, port: gwPort, method: "CONNECT", path: u.host}).on("connect", (res, socket) => {
  if (res.statusCode !== 200) { console.log("CONNECT", res.statusCode); process.exit(1); }
  https.get({host: u.hostname, port: u.port, path: u.pathname, createConnection: () => tls.connect({socket, host: u.hostname})}, (r) => {
    let body = ""; r.on("data", (d) => body += d);
    r.on("end", () => { console.log(r.statusCode, r.headers["x-proxyfleet-attempts"], JSON.parse(body).path); process.exit(0); });
  }).on("error", (e) => { console.log("error", e.message); process.exit(1); });
}).end();`
		out := run(t, append(cleanEnv, "NODE_EXTRA_CA_CERTS="+m.caFile, "GW="+m.g.addr, "URL="+nodeSite.URL()+"/node"), node, "-e", script)
		if strings.TrimSpace(out) != "200 2 /node" {
			t.Fatalf("node printed %q, want \"200 2 /node\"", out)
		}
		m.wantRetried(t, nodeSite, "/node")
	})

	t.Run("headless Chromium trusting the CA by its SPKI hash", func(t *testing.T) {
		chromium, err := exec.LookPath(chromiumBinary)
		if err != nil {
			t.Fatalf("%s not found (make test installs it with hack/install-deps.sh): %v", chromiumBinary, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, chromium,
			"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
			"--user-data-dir="+t.TempDir(),
			"--proxy-server=http://"+m.g.addr, "--proxy-bypass-list=<-loopback>",
			// Trust the MITM CA only: no --ignore-certificate-errors.
			"--ignore-certificate-errors-spki-list="+m.caSPKI,
			"--virtual-time-budget=30000", "--dump-dom", chromeSite.URL()+"/")
		cmd.Env = cleanEnv
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium: %v\n%s", err, tail(stderr.String(), 30))
		}
		// The page ran, so Chromium got the retried 200 (the first answer to
		// "/" was a 429); its own fetch, from the Squid that served the
		// page, took one attempt and could read the gateway's headers.
		if !strings.Contains(stdout.String(), `<div id="out">attempts:1 path:/data</div>`) {
			t.Fatalf("the page did not get its retried data:\n%s\nthe site saw %+v\ngateway:\n%s",
				tail(stdout.String(), 20), chromeSite.Requests(), tail(m.g.Output(), 30))
		}
		m.wantRetried(t, chromeSite, "/")
	})
}

// attemptsPage fetches /data from its own origin and shows how many
// members the gateway tried for it (a same-origin fetch may read headers).
// It shows anything only if Chromium got the page itself.
const attemptsPage = `<!doctype html><html><body><div id="out">waiting</div><script>
fetch("/data").then(r => r.json().then(a => {
  document.getElementById("out").textContent = "attempts:" + r.headers.get("X-Proxyfleet-Attempts") + " path:" + a.path;
})).catch(e => { document.getElementById("out").textContent = "failed:" + e; });
</script></body></html>`

// pythonWith finds a python3 that can import module: the one on PATH,
// else Debian's (make test installs python3-<module> for it).
func pythonWith(t *testing.T, module string) string {
	t.Helper()
	var tried []string
	for _, name := range []string{"python3", "/usr/bin/python3"} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		tried = append(tried, p)
		if exec.Command(p, "-c", "import "+module).Run() == nil {
			return p
		}
	}
	t.Fatalf("no python3 with %s among %v (make test installs Debian's python3-%s with hack/install-deps.sh)", module, tried, module)
	return ""
}

// run runs a client and returns its stdout, failing the test on an error.
func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", name, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// hasHeader reports whether a curl -D dump has the header with the value.
func hasHeader(dump, name, value string) bool {
	for _, line := range strings.Split(dump, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && strings.EqualFold(k, name) && strings.TrimSpace(v) == value {
			return true
		}
	}
	return false
}
