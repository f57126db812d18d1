package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

const leaseTestToken = "lease-cli-token"

// leaseAPI is a real Store behind a real lease API server on loopback.
type leaseAPI struct {
	store     *pool.Store
	url       string
	tokenFile string
}

func startLeaseAPI(t *testing.T) *leaseAPI {
	t.Helper()
	mustURL := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	st := pool.NewStore(pool.StoreOptions{MaxTTL: time.Hour})
	st.SetMembers([]pool.Member{
		{Name: "a", URL: mustURL("http://user:secret-a@127.0.0.1:3128"), Attributes: map[string]string{"region": "eu", "tier": "dc"}},
		{Name: "b", URL: mustURL("http://user:secret-b@127.0.0.2:3128"), Attributes: map[string]string{"region": "eu", "tier": "res"}},
		{Name: "c", URL: mustURL("http://127.0.0.3:3128"), Attributes: map[string]string{"region": "us", "tier": "dc"}},
	})
	srv := httptest.NewServer(leaseapi.NewAPIServer(st, leaseapi.APIOptions{Token: leaseTestToken, Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(srv.Close)
	// The comment line pins that the CLI reads the same token-file format as
	// the gateway's --lease-api-token-file, so one file serves both.
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("# lease API token\n"+leaseTestToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &leaseAPI{store: st, url: srv.URL, tokenFile: tokenFile}
}

// run runs `proxyfleet lease <args>` in-process and returns its stdout.
func (l *leaseAPI) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := &cli.App{
		Name:      "proxyfleet",
		Commands:  []*cli.Command{leaseCommand()},
		Writer:    &out,
		ErrWriter: &errOut,
	}
	err := app.Run(append([]string{"proxyfleet", "lease"}, args...))
	return out.String(), err
}

// ok runs a subcommand with --api and --token-file appended and fails on error.
func (l *leaseAPI) ok(t *testing.T, args ...string) string {
	t.Helper()
	out, err := l.run(t, append(args, "--api", l.url, "--token-file", l.tokenFile)...)
	if err != nil {
		t.Fatalf("lease %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (l *leaseAPI) activeLeases() int {
	n := 0
	for _, m := range l.store.Members() {
		n += m.ActiveLeases
	}
	return n
}

func decodeLeaseJSON[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("output is not the expected JSON: %v\n%s", err, out)
	}
	return v
}

type leaseListJSON struct {
	Proxies []leaseapi.ProxyInfo `json:"proxies"`
	Count   int                  `json:"count"`
}

func TestLeaseCLIList(t *testing.T) {
	api := startLeaseAPI(t)
	api.store.SetHealth("b", false, 0)
	api.store.SetHealth("a", true, 17*time.Millisecond)

	t.Run("table by default, passwords redacted", func(t *testing.T) {
		out := api.ok(t, "list")
		for _, want := range []string{"NAME", "HEALTHY", "a ", "b ", "c ", "http://user:xxxxx@127.0.0.1:3128", "17ms", "region=eu,tier=dc"} {
			if !strings.Contains(out, want) {
				t.Errorf("table lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "secret") {
			t.Errorf("table leaks a password:\n%s", out)
		}
	})
	t.Run("json with filters", func(t *testing.T) {
		l := decodeLeaseJSON[leaseListJSON](t, api.ok(t, "list", "--attr", "region=eu", "--healthy", "--output", "json"))
		if l.Count != 1 || len(l.Proxies) != 1 || l.Proxies[0].Name != "a" {
			t.Errorf("list = %+v, want only a", l)
		}
	})
	t.Run("comma-separated and repeated --attr are ANDed", func(t *testing.T) {
		l := decodeLeaseJSON[leaseListJSON](t, api.ok(t, "list", "--attr", "tier=dc,region=us", "--output", "json"))
		if l.Count != 1 || l.Proxies[0].Name != "c" {
			t.Errorf("list = %+v, want only c", l)
		}
	})
}

func TestLeaseCLIAcquireReportRelease(t *testing.T) {
	api := startLeaseAPI(t)

	info := decodeLeaseJSON[leaseapi.LeaseInfo](t, api.ok(t, "acquire", "--selector", "tier=dc", "--target", "Example.COM:443", "--ttl", "120s"))
	if info.LeaseID == "" || info.Proxy.Name != "a" || info.Target != "example.com" || info.TTLSeconds != 120 {
		t.Fatalf("acquire = %+v", info)
	}
	if info.Proxy.URL != "http://user:secret-a@127.0.0.1:3128" {
		t.Errorf("JSON acquire URL = %q, want the credentials for scripts", info.Proxy.URL)
	}
	if api.activeLeases() != 1 {
		t.Fatalf("active leases = %d", api.activeLeases())
	}

	t.Run("table acquire hides the password", func(t *testing.T) {
		out := api.ok(t, "acquire", "--proxy", "c", "--output", "table")
		if !strings.Contains(out, "LEASE") || !strings.Contains(out, "http://127.0.0.3:3128") {
			t.Errorf("table:\n%s", out)
		}
		out = api.ok(t, "acquire", "--proxy", "b", "--output", "table")
		if strings.Contains(out, "secret-b") || !strings.Contains(out, "xxxxx") {
			t.Errorf("table leaks or lacks the redacted URL:\n%s", out)
		}
	})

	t.Run("report with flags after the lease ID cools the member down", func(t *testing.T) {
		out := api.ok(t, "report", info.LeaseID, "--result", "rate_limited", "--retry-after", "30s")
		if !strings.Contains(out, "reported rate_limited") {
			t.Errorf("output %q", out)
		}
		l := decodeLeaseJSON[leaseListJSON](t, api.ok(t, "list", "--output", "json"))
		if cds := l.Proxies[0].Cooldowns; len(cds) != 1 || cds[0].Target != "example.com" {
			t.Errorf("a cooldowns = %+v, want example.com (the lease's target)", cds)
		}
		if out := api.ok(t, "list"); !strings.Contains(out, "example.com(") {
			t.Errorf("table does not show the cooldown:\n%s", out)
		}
	})
	t.Run("report with flags before the lease ID and another target", func(t *testing.T) {
		if _, err := api.run(t, "report", "--api", api.url, "--token-file", api.tokenFile, "--result", "banned", "--target", "example.org", info.LeaseID); err != nil {
			t.Fatal(err)
		}
		l := decodeLeaseJSON[leaseListJSON](t, api.ok(t, "list", "--output", "json"))
		if cds := l.Proxies[0].Cooldowns; len(cds) != 2 || cds[1].Target != "example.org" {
			t.Errorf("a cooldowns = %+v, want example.com and example.org", cds)
		}
	})
	t.Run("release twice", func(t *testing.T) {
		for range 2 {
			if out := api.ok(t, "release", info.LeaseID); strings.TrimSpace(out) != "released "+info.LeaseID {
				t.Errorf("output %q", out)
			}
		}
		out := api.ok(t, "release", info.LeaseID, "--output", "json")
		if r := decodeLeaseJSON[map[string]any](t, out); r["released"] != true {
			t.Errorf("json release = %s", out)
		}
		if n := api.activeLeases(); n != 2 {
			t.Errorf("active leases = %d, want the 2 table acquires", n)
		}
	})
}

func TestLeaseCLITakesAPIAndTokenFromEnv(t *testing.T) {
	api := startLeaseAPI(t)
	t.Setenv("PROXYFLEET_API", api.url)
	t.Setenv("PROXYFLEET_LEASE_API_TOKEN_FILE", api.tokenFile)
	out, err := api.run(t, "list", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	if l := decodeLeaseJSON[leaseListJSON](t, out); l.Count != 3 {
		t.Errorf("count = %d", l.Count)
	}
}

func TestLeaseCLIErrorsNameTheFlag(t *testing.T) {
	api := startLeaseAPI(t)
	lease := decodeLeaseJSON[leaseapi.LeaseInfo](t, api.ok(t, "acquire", "--proxy", "a"))
	before := api.activeLeases()

	dir := t.TempDir()
	wrongToken := filepath.Join(dir, "wrong")
	emptyToken := filepath.Join(dir, "empty")
	if err := os.WriteFile(wrongToken, []byte("nope"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(emptyToken, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()

	auth := []string{"--api", api.url, "--token-file", api.tokenFile}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"bad --attr", append([]string{"list", "--attr", "region"}, auth...), []string{"--attr", "key=value"}},
		{"bad --selector", append([]string{"acquire", "--selector", "=eu"}, auth...), []string{"--selector"}},
		{"fractional --ttl", append([]string{"acquire", "--ttl", "1500ms"}, auth...), []string{"--ttl", "whole seconds"}},
		{"negative --ttl", append([]string{"acquire", "--ttl", "-5s"}, auth...), []string{"--ttl", "negative"}},
		{"--ttl above the maximum", append([]string{"acquire", "--ttl", "2h"}, auth...), []string{"--ttl", "3600"}},
		{"bad --output", append([]string{"list", "--output", "xml"}, auth...), []string{"--output", "json or table"}},
		{"missing --result", append([]string{"report", lease.LeaseID}, auth...), []string{"--result", "required"}},
		{"bad --result", append([]string{"report", lease.LeaseID, "--result", "meh"}, auth...), []string{"--result", "meh"}},
		{"negative --retry-after", append([]string{"report", lease.LeaseID, "--result", "banned", "--retry-after", "-1s"}, auth...), []string{"--retry-after"}},
		{"unknown flag after the ID", append([]string{"report", lease.LeaseID, "--bogus", "x"}, auth...), []string{"--bogus"}},
		{"flag after the ID without a value", append(append([]string{"report"}, auth...), lease.LeaseID, "--result"), []string{"--result", "needs a value"}},
		{"report without an ID", append([]string{"report", "--result", "ok"}, auth...), []string{"LEASE_ID"}},
		{"release with two IDs", append([]string{"release", "x", "y"}, auth...), []string{"one LEASE_ID"}},
		{"list with an argument", append([]string{"list", "extra"}, auth...), []string{"no arguments", "extra"}},
		{"report on an unknown lease", append([]string{"report", "nope", "--result", "ok"}, auth...), []string{"unknown lease"}},
		{"no usable member", append([]string{"acquire", "--proxy", "zz"}, auth...), []string{"no usable upstream", "0 considered"}},
		{"missing token file", []string{"list", "--api", api.url, "--token-file", filepath.Join(dir, "missing")}, []string{"--token-file"}},
		{"empty token file", []string{"list", "--api", api.url, "--token-file", emptyToken}, []string{"--token-file", "empty"}},
		{"wrong token", []string{"list", "--api", api.url, "--token-file", wrongToken}, []string{"401", "--token-file"}},
		{"no token", []string{"acquire", "--api", api.url}, []string{"401", "--token-file"}},
		{"bad --api", []string{"list", "--api", "ftp://127.0.0.1"}, []string{"--api", "scheme"}},
		{"unreachable --api", []string{"list", "--api", dead}, []string{"--api", dead, "unreachable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := api.run(t, tc.args...)
			if err == nil {
				t.Fatalf("lease %v succeeded", tc.args)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), leaseTestToken) {
				t.Errorf("error leaks the token: %q", err)
			}
			if n := api.activeLeases(); n != before {
				t.Errorf("active leases %d -> %d after a failed command", before, n)
			}
		})
	}
	for _, m := range api.store.Members() {
		if len(m.Cooldowns) != 0 {
			t.Errorf("%s has cooldowns %v after rejected reports", m.Name, m.Cooldowns)
		}
	}
}
