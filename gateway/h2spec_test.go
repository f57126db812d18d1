//go:build !nomirror

package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/xml"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
)

// h2specVersion is the conformance suite the test runs (go run, from the
// Go module proxy, like staticcheck in the Makefile).
const h2specVersion = "github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible"

// TestMITMH2ConformsAsTheSiteDoes runs h2spec, the HTTP/2 conformance
// suite, against an HTTPS site speaking HTTP/2 (net/http's server)
// directly, and through the mirroring MITM gateway: a relay of the test's
// own opens the CONNECT and hands the tunnel to h2spec, which then speaks
// TLS and HTTP/2 to the gateway. Every test case the site passes, the
// gateway passes. (Before the gateway sent its SETTINGS at once, it passed
// 1 of them: h2spec waits for the server's preface.)
func TestMITMH2ConformsAsTheSiteDoes(t *testing.T) {
	_, members := squidMembers(t, squid.Options{Name: "h2spec", OutgoingAddr: "127.0.0.231"})
	site := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "conformance")
	}))
	ln, err := net.Listen("tcp", "127.0.0.232:0")
	if err != nil {
		t.Fatal(err)
	}
	site.Listener = ln
	site.EnableHTTP2 = true
	cert, roots, err := testutil.SelfSignedCert(net.ParseIP("127.0.0.232"))
	if err != nil {
		t.Fatal(err)
	}
	site.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	site.StartTLS()
	t.Cleanup(site.Close)
	ca, _ := newTestCA(t)
	e := newEnv(t, Options{AllowPrivateTargets: true, SiteRoots: roots, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		MITM: &MITMOptions{CA: ca, Fingerprint: FingerprintMirror}}, pool.StoreOptions{}, members...)
	relay := connectRelay(t, e.addr, site.Listener.Addr().String())

	direct := h2spec(t, site.Listener.Addr().String())
	through := h2spec(t, relay)
	var lost []string
	for name, ok := range direct {
		if ok && !through[name] {
			lost = append(lost, name)
		}
	}
	slices.Sort(lost)
	passed := func(m map[string]bool) (n int) {
		for _, ok := range m {
			if ok {
				n++
			}
		}
		return n
	}
	t.Logf("h2spec: the site passes %d of %d, the gateway %d of %d", passed(direct), len(direct), passed(through), len(through))
	if len(direct) < 100 || len(through) != len(direct) || len(lost) > 0 {
		t.Fatalf("through the gateway h2spec fails %d cases the site passes (%d run directly, %d through the gateway):\n%s",
			len(lost), len(direct), len(through), strings.Join(lost, "\n"))
	}
}

// connectRelay listens on a free loopback port; each connection to it
// becomes a CONNECT to target through the proxy at proxyAddr, and once
// that is answered 200 the bytes flow both ways.
func connectRelay(t *testing.T, proxyAddr, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				p, err := net.Dial("tcp", proxyAddr)
				if err != nil {
					return
				}
				defer p.Close()
				req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: target}, Host: target, Header: http.Header{}}
				if req.Write(p) != nil {
					return
				}
				br := bufio.NewReader(p)
				resp, err := http.ReadResponse(br, req)
				if err != nil || resp.StatusCode != http.StatusOK {
					return
				}
				go func() {
					_, _ = io.Copy(p, c)
					_ = p.(*net.TCPConn).CloseWrite()
				}()
				_, _ = io.Copy(c, br)
			}()
		}
	}()
	return ln.Addr().String()
}

// h2spec runs the suite over TLS against addr and returns each test
// case's result by name.
func h2spec(t *testing.T, addr string) map[string]bool {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	report := filepath.Join(t.TempDir(), "report.xml")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", h2specVersion, "-t", "-k", "-h", host, "-p", port, "-o", "5", "-j", report)
	out, err := cmd.CombinedOutput()
	raw, rerr := os.ReadFile(report)
	if rerr != nil {
		t.Fatalf("h2spec against %s wrote no report (%v): %v\n%s", addr, rerr, err, tail(string(out), 40))
	}
	var suites struct {
		Suites []struct {
			Name  string `xml:"name,attr"`
			Cases []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
				Error   *struct{} `xml:"error"`
				Skipped *struct{} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(raw, &suites); err != nil {
		t.Fatalf("h2spec's report: %v", err)
	}
	res := map[string]bool{}
	for _, s := range suites.Suites {
		for i, c := range s.Cases {
			if c.Skipped != nil {
				continue
			}
			res[s.Name+" #"+strconv.Itoa(i+1)+" "+c.Name] = c.Failure == nil && c.Error == nil
		}
	}
	return res
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
