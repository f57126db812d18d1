// Package daemontest starts a gateway run in-process for a test and waits
// for its usage block: the one harness for the tests of the run itself
// (gateway/daemon) and of the command that reads its flags
// (cmd/proxyfleet), which start it differently and read it the same way.
//
// It is test support: only _test.go files import it. It imports
// internal/testutil for the output buffer and nothing of the gateway's; the
// caller passes the run.
package daemontest

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// Gateway is a run started by Start.
type Gateway struct {
	// Stderr is everything the run wrote so far.
	Stderr *testutil.LockedBuffer
	// Proxy is the proxy port's host:port.
	Proxy string
	// API is the lease API's host:port, or "" when it is off.
	API string
	// Metrics is the metrics listener's host:port, or "" when it is off.
	Metrics string
	// Status is where the usage block says the status page is, or "".
	Status string

	cancel context.CancelFunc
	done   chan error
}

// The lines of the usage block the harness reads addresses from.
var (
	listeningRE = regexp.MustCompile(`proxyfleet gateway listening on (\S+) `)
	apiRE       = regexp.MustCompile(`lease API: http://(\S+)/v1/proxies`)
	metricsRE   = regexp.MustCompile(`metrics: +http://(\S+)/metrics`)
	statusRE    = regexp.MustCompile(`status: +http://(\S+)/status`)
)

// Start calls run with a context and the stderr it must write to, returns
// once the usage block names the proxy port (failing the test if run
// returns first or 30s pass), and stops the run when the test ends.
func Start(t testing.TB, run func(ctx context.Context, stderr io.Writer) error) *Gateway {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	g := &Gateway{Stderr: &testutil.LockedBuffer{}, cancel: cancel, done: make(chan error, 1)}
	go func() { g.done <- run(ctx, g.Stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-g.done:
		case <-time.After(30 * time.Second):
			t.Error("gateway did not stop within 30s of cancel")
		}
	})

	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		out := g.Stderr.String()
		if m := listeningRE.FindStringSubmatch(out); m != nil {
			g.Proxy = m[1]
			if m := apiRE.FindStringSubmatch(out); m != nil {
				g.API = m[1]
			}
			if m := metricsRE.FindStringSubmatch(out); m != nil {
				g.Metrics = m[1]
			}
			if m := statusRE.FindStringSubmatch(out); m != nil {
				g.Status = m[1]
			}
			return g
		}
		select {
		case err := <-g.done:
			t.Fatalf("gateway exited before serving: %v\n%s", err, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no startup message within 30s:\n%s", g.Stderr.String())
	return nil
}

// Stop cancels the run's context (what SIGTERM does) and returns its error.
func (g *Gateway) Stop(t testing.TB) error {
	t.Helper()
	g.cancel()
	exited, err := g.Exited(30 * time.Second)
	if !exited {
		t.Fatal("gateway did not stop within 30s")
	}
	return err
}

// Exited waits up to d for the run to return on its own (a signal, a
// fatal error) and says whether it did, with its error.
func (g *Gateway) Exited(d time.Duration) (exited bool, err error) {
	select {
	case err := <-g.done:
		g.done <- err // for Stop and the cleanup
		return true, err
	case <-time.After(d):
		return false, nil
	}
}

// Get fetches u with client and returns the status and body, failing the
// test when the request or the read fails.
func Get(t testing.TB, client *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := client.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}
