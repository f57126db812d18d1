package e2e

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// Response headers the gateway sets on every answer (and the CONNECT 200).
const (
	hdrProxy  = "X-Proxyfleet-Proxy"
	hdrLease  = "X-Proxyfleet-Lease"
	hdrReason = "X-Proxyfleet-Reason"
)

// gwConfig is one gateway process's configuration in a test.
type gwConfig struct {
	// upstreams become --upstream flags.
	upstreams []string
	// upstreamsFile, when set, is written to a file given as --upstreams-file.
	upstreamsFile string
	// rotation is --rotation (sticky when empty: the gateway's default).
	rotation string
	// authToken, when set, is the token of the one client (e2e, allowed
	// every member) of --auth-token-file.
	authToken string
	// api serves the lease API on a free port with a bearer token.
	api bool
	// refusePrivate leaves out --allow-private-targets (every target here is loopback).
	refusePrivate bool
	// args are appended as they are.
	args []string
	// env is added to the gateway's (otherwise proxy-free) environment.
	env []string
}

// gatewayProc is a running `proxyfleet gateway`.
type gatewayProc struct {
	*testutil.Process
	addr        string // proxy listen address
	metricsAddr string
	apiAddr     string // "" without cfg.api
	apiToken    string
	authToken   string
	dir         string
	bin         string
}

// startGateway runs the real binary with cfg on free loopback ports and waits
// until the proxy, metrics and (if asked) API listeners accept connections.
// At cleanup it is stopped with SIGTERM and must exit 0.
func startGateway(t *testing.T, bin string, cfg gwConfig) *gatewayProc {
	t.Helper()
	dir := t.TempDir()
	g := &gatewayProc{dir: dir, bin: bin, authToken: cfg.authToken}
	var fileArgs []string
	if cfg.upstreamsFile != "" {
		p := filepath.Join(dir, "upstreams.txt")
		writeFile(t, p, cfg.upstreamsFile)
		fileArgs = append(fileArgs, "--upstreams-file", p)
	}
	if cfg.authToken != "" {
		p := filepath.Join(dir, "auth-tokens")
		writeFile(t, p, "# clients\ne2e "+cfg.authToken+" all\n")
		fileArgs = append(fileArgs, "--auth-token-file", p)
	}
	if cfg.api {
		g.apiToken = "api-token-" + filepath.Base(dir)
		p := filepath.Join(dir, "api-token")
		writeFile(t, p, g.apiToken+"\n")
		fileArgs = append(fileArgs, "--lease-api-token-file", p)
	}
	nPorts := 2
	if cfg.api {
		nPorts = 3
	}
	proc, addrs := testutil.StartProcessOnFreePorts(t, bin, nPorts, func(addrs []string) testutil.ProcessOptions {
		args := []string{"gateway", "--listen", addrs[0], "--metrics-listen", addrs[1], "--shutdown-grace", "10s"}
		if cfg.api {
			args = append(args, "--lease-api-listen", addrs[2])
		}
		for _, u := range cfg.upstreams {
			args = append(args, "--upstream", u)
		}
		if cfg.rotation != "" {
			args = append(args, "--rotation", cfg.rotation)
		}
		if !cfg.refusePrivate {
			args = append(args, "--allow-private-targets")
		}
		args = append(args, fileArgs...)
		args = append(args, cfg.args...)
		return testutil.ProcessOptions{
			Name:            "gateway[" + t.Name() + "]",
			Args:            args,
			Env:             cfg.env,
			WaitAddrs:       addrs,
			ExpectCleanExit: true,
		}
	})
	g.Process = proc
	g.addr, g.metricsAddr = addrs[0], addrs[1]
	if cfg.api {
		g.apiAddr = addrs[2]
	}
	return g
}

// poolAPIArgs are the flags of a gateway leasing from the lease API at
// apiURL (comma-separated for several replicas) with token (--lease-api,
// --pool-token-file), then extra.
func poolAPIArgs(t *testing.T, apiURL, token string, extra ...string) []string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pool-token")
	writeFile(t, p, token+"\n")
	return append([]string{"--lease-api", apiURL, "--pool-token-file", p}, extra...)
}

// proxyURL is the gateway's proxy URL with user:token credentials when user is set.
func (g *gatewayProc) proxyURL(user, token string) string {
	u := &url.URL{Scheme: "http", Host: g.addr}
	if user != "" {
		u.User = url.UserPassword(user, token)
	}
	return u.String()
}

// client is an http.Client proxying through the gateway as user (with the
// gateway's auth token when it has one).
func (g *gatewayProc) client(t *testing.T, user string, tlsConf *tls.Config) *http.Client {
	t.Helper()
	token := g.authToken
	if user == "" && token != "" {
		user = "e2e"
	}
	return testutil.MustProxyClient(t, g.proxyURL(user, token), tlsConf)
}

// tunnelClient is like client but opens a new CONNECT tunnel for every request.
func (g *gatewayProc) tunnelClient(t *testing.T, user string, tlsConf *tls.Config) *http.Client {
	t.Helper()
	c := g.client(t, user, tlsConf)
	c.Transport.(*http.Transport).DisableKeepAlives = true
	return c
}

// apiDo sends one lease API request with the given bearer token and returns
// the status and body.
func (g *gatewayProc) apiDo(t *testing.T, method, path, token string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+g.apiAddr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startSquids starts one Squid per outgoing address, concurrently.
func startSquids(t *testing.T, name string, outgoing ...string) []*squid.Squid {
	t.Helper()
	opts := make([]squid.Options, len(outgoing))
	for i, out := range outgoing {
		opts[i] = squid.Options{Name: fmt.Sprintf("%s-%d", name, i), OutgoingAddr: out}
	}
	return squid.StartAll(t, opts...)
}

// squidURLs are the proxy URLs of squids, for --upstream.
func squidURLs(squids []*squid.Squid) []string {
	out := make([]string, len(squids))
	for i, sq := range squids {
		out[i] = sq.URL()
	}
	return out
}

// outgoingAddrs are the source addresses squids give their traffic, sorted.
func outgoingAddrs(squids []*squid.Squid) []string {
	out := make([]string, len(squids))
	for i, sq := range squids {
		out[i] = sq.OutgoingAddr()
	}
	sort.Strings(out)
	return out
}

// getResult is one GET through the gateway as the target answered it.
type getResult struct {
	status int
	source string // the source address the target saw ("" when the target did not answer)
	proxy  string // X-Proxyfleet-Proxy
	lease  string // X-Proxyfleet-Lease
	reason string // X-Proxyfleet-Reason
	body   string
	header http.Header // the whole answer head
}

// doGet sends one GET through c and reads the answer, whatever its status.
func doGet(c *http.Client, rawURL string, header http.Header) (getResult, error) {
	req, err := http.NewRequest(http.MethodGet, rawURL, nil)
	if err != nil {
		return getResult{}, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := c.Do(req)
	if err != nil {
		return getResult{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return getResult{}, err
	}
	return getResult{
		status: resp.StatusCode,
		source: resp.Header.Get(testutil.SeenSourceHeader),
		proxy:  resp.Header.Get(hdrProxy),
		lease:  resp.Header.Get(hdrLease),
		reason: resp.Header.Get(hdrReason),
		body:   string(body),
		header: resp.Header,
	}, nil
}

// mustGet is doGet that fails the test on a transport error.
func mustGet(t *testing.T, c *http.Client, rawURL string, header http.Header) getResult {
	t.Helper()
	r, err := doGet(c, rawURL, header)
	if err != nil {
		t.Fatalf("GET %s: %v", rawURL, err)
	}
	return r
}

// mustGetOK is mustGet that also requires a 200 from the target.
func mustGetOK(t *testing.T, c *http.Client, rawURL string, header http.Header) getResult {
	t.Helper()
	r := mustGet(t, c, rawURL, header)
	if r.status != http.StatusOK || r.source == "" {
		t.Fatalf("GET %s: %d (reason %q) %s, want 200 from the target", rawURL, r.status, r.reason, strings.TrimSpace(r.body))
	}
	return r
}

// keys returns a set's members sorted.
func keys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
