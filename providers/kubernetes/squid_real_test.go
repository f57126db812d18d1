package kubernetes

// These tests run the generated squid.conf through the real Squid
// (/usr/sbin/squid from Debian): once to parse it, once serving requests on
// 127.0.0.1 to prove the deny rules refuse inward targets.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/dnssink"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers/squidconf"
)

const squidBinaryOnHost = "/usr/sbin/squid"

func requireSquid(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(squidBinaryOnHost); err != nil {
		t.Fatalf("squid not installed (%v): run make test as root (it apt-installs squid) or apt-get install squid", err)
	}
}

// parseSquidConf runs squid -k parse and returns every WARNING, ERROR or FATAL line.
func parseSquidConf(t *testing.T, conf string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "squid.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(squidBinaryOnHost, "-k", "parse", "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("squid -k parse failed: %v\n%s\nconfig:\n%s", err, out, conf)
	}
	var problems []string
	for _, line := range strings.Split(string(out), "\n") {
		// via off is deliberate: the target must not learn about the chain.
		if strings.Contains(line, "HTTP requires the use of Via") {
			continue
		}
		if strings.Contains(line, "WARNING") || strings.Contains(line, "ERROR") || strings.Contains(line, "FATAL") {
			problems = append(problems, line)
		}
	}
	return problems
}

func TestGeneratedSquidConfParsesCleanly(t *testing.T) {
	requireSquid(t)
	tests := []struct {
		name string
		cfg  Config
		port int
	}{
		{"defaults", Config{Namespace: "egress"}, 3128},
		{"low port", Config{Namespace: "egress"}, 80},
		{"cluster CIDRs inside and outside the private ranges", Config{Namespace: "egress", ClusterCIDRs: []netip.Prefix{
			netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:42::/56")}}, 3128},
		{"admitted cluster ranges", Config{Namespace: "egress", ClusterTargets: []netip.Prefix{
			netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}}, 3128},
		{"explicit clients overlapping each other", Config{Namespace: "egress", ClientCIDRs: []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16")}}, 3128},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := testRequest()
			req.Port = tt.port
			pod, err := buildPod(tt.cfg, req)
			if err != nil {
				t.Fatal(err)
			}
			if problems := parseSquidConf(t, pod.Annotations[AnnotationSquidConf]); len(problems) > 0 {
				t.Fatalf("squid complains about the generated config:\n%s", strings.Join(problems, "\n"))
			}
		})
	}
}

// runSquid starts Squid in the foreground on 127.0.0.1 with conf rendered for
// a free port, as the image's uid 13 when the test runs as root (like the Pod).
// The extra lines are appended: what is the test's and not the Pod's (its
// resolver).
func runSquid(t *testing.T, conf squidconf.Config, extra ...string) (proxyURL *url.URL) {
	t.Helper()
	requireSquid(t)
	for attempt := 0; attempt < 5; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		conf.Port = l.Addr().(*net.TCPAddr).Port
		l.Close()
		conf.ListenAddr = "127.0.0.1"
		dir := t.TempDir()
		// Squid runs as uid 13: it must read the file and traverse t's temp dirs.
		for _, d := range []string{filepath.Dir(dir), dir} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		path := filepath.Join(dir, "squid.conf")
		text := conf.Render()
		for _, l := range extra {
			text += l + "\n"
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		service := squid.ServiceName()
		t.Cleanup(func() { squid.RemoveShm(service) })
		cmd := exec.Command(squidBinaryOnHost, "-N", "-n", service, "-d", "1", "-f", path)
		cmd.Stderr = &stderr
		if os.Geteuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(squidUID), Gid: uint32(squidUID)}}
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		stop := func() {
			_ = cmd.Process.Kill()
			<-exited
		}
		addr := fmt.Sprintf("127.0.0.1:%d", conf.Port)
		deadline := time.Now().Add(30 * time.Second)
		for {
			select {
			case <-exited:
				if strings.Contains(stderr.String(), "Address already in use") {
					goto retry
				}
				t.Fatalf("squid exited before listening:\n%s", stderr.String())
			default:
			}
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Cleanup(stop)
				return &url.URL{Scheme: "http", Host: addr}
			}
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("squid did not listen on %s within 30s:\n%s", addr, stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	retry:
		stop()
	}
	t.Fatal("squid found no free port in 5 attempts")
	return nil
}

func TestGeneratedSquidRefusesInwardTargets(t *testing.T) {
	var hits atomic.Int64
	target := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintln(w, "reached")
	}), ReadHeaderTimeout: 5 * time.Second}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = target.Serve(l) }()
	t.Cleanup(func() { _ = target.Close() })
	targetPort := l.Addr().(*net.TCPAddr).Port

	// Clients from loopback are allowed here, so a refusal can only come from
	// the destination rules under test, not from the client rule.
	proxy := runSquid(t, squidconf.Config{
		Name:    "proxy-realtest",
		Denied:  DefaultDeniedDestinations(),
		Clients: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
	})

	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 10 * time.Second}
	for _, u := range []string{
		fmt.Sprintf("http://127.0.0.1:%d/", targetPort),
		fmt.Sprintf("http://127.0.0.2:%d/", targetPort),
		fmt.Sprintf("http://localhost:%d/", targetPort),
		fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/", targetPort),
	} {
		t.Run("GET "+u, func(t *testing.T) {
			resp, err := client.Get(u)
			if err != nil {
				t.Fatalf("request through squid: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("status %d, want 403 from squid", resp.StatusCode)
			}
		})
	}
	for _, hostport := range []string{fmt.Sprintf("127.0.0.1:%d", targetPort), "127.0.0.1:443", "127.0.0.1:22"} {
		t.Run("CONNECT "+hostport, func(t *testing.T) {
			if code := connectStatus(t, proxy.Host, hostport); code != http.StatusForbidden {
				t.Fatalf("CONNECT %s answered %d, want 403", hostport, code)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the loopback target was reached %d times through squid", n)
	}
}

// TestGeneratedSquidRefusesOtherSourcesBeforeAnyLookup: a Pod's Squid has no
// login, so its client ranges are its gate. A client outside them is refused
// on its address alone, before Squid resolves the name it asked for: the
// test's name server never answers (a lookup would wait Squid's two-minute
// dns_timeout, past every deadline here) and records what it is asked.
func TestGeneratedSquidRefusesOtherSourcesBeforeAnyLookup(t *testing.T) {
	const (
		nowhere = "nowhere.proxyfleet.invalid"
		lookup  = "looked-up.proxyfleet.invalid"
	)
	dns := dnssink.Start(t)
	// Only 127.0.0.2 is a client; requests from 127.0.0.1 are a stranger's.
	proxy := runSquid(t, squidconf.Config{
		Name:    "proxy-gatetest",
		Denied:  DefaultDeniedDestinations(),
		Clients: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
	}, "dns_nameservers "+dns.IP(), "dns_timeout 120 seconds")
	from := func(ip string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DialContext: d.DialContext, DisableKeepAlives: true}, Timeout: time.Minute}
	}

	resp, err := from("127.0.0.1").Get("http://" + nowhere + "/")
	if err != nil {
		t.Fatalf("a stranger's GET: %v (no answer means Squid waited on a lookup: its name server never answers)", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a stranger's GET of %s answered %d, want 403", nowhere, resp.StatusCode)
	}
	if code := connectStatus(t, proxy.Host, nowhere+":443"); code != http.StatusForbidden {
		t.Fatalf("a stranger's CONNECT %s:443 answered %d, want 403", nowhere, code)
	}
	if n := dns.Asked(nowhere); n != 0 {
		t.Fatalf("Squid sent %d queries for %s, asked for only by a source outside its client ranges", n, nowhere)
	}

	// The control: a client's request for a name makes Squid ask the name
	// server (and wait), so the silence above is the gate's doing.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+lookup+"/", nil)
		if resp, err := from("127.0.0.2").Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	poll.Until(t, time.Minute, "Squid's lookup of the client's name", func() error {
		if dns.Asked(lookup) == 0 {
			return fmt.Errorf("Squid has not asked its name server for %s, the name a client wants", lookup)
		}
		return nil
	})
}

// connectStatus sends CONNECT hostport to the proxy and returns the status code.
func connectStatus(t *testing.T, proxy, hostport string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("reading CONNECT answer: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
