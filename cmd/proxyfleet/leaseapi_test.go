package main

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway"
	"github.com/proxyfleet/proxyfleet/gateway/daemon/daemontest"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

func TestPoolAPIFlags(t *testing.T) {
	token := writeFile(t, "pool-token", "# the controller's token\npool-s3cret\n")
	two := writeFile(t, "two-tokens", "a\nb\n")
	upstreams := writeFile(t, "upstreams", "http://127.0.0.1:1\n")

	t.Run("the flags set remote pool mode", func(t *testing.T) {
		cfg, err := runConfig(t, "--lease-api", "http://127.0.0.1:8090", "--pool-token-file", token)
		if err != nil || cfg.PoolAPI != "http://127.0.0.1:8090" || cfg.poolToken != "pool-s3cret" {
			t.Fatalf("cfg %+v, err %v", cfg, err)
		}
	})

	t.Run("the environment sets remote pool mode", func(t *testing.T) {
		t.Setenv("PROXYFLEET_LEASE_API", "http://controller.proxyfleet:8090/")
		t.Setenv("PROXYFLEET_POOL_TOKEN_FILE", token)
		cfg, err := runConfig(t)
		if err != nil || cfg.PoolAPI != "http://controller.proxyfleet:8090/" || cfg.poolToken != "pool-s3cret" {
			t.Fatalf("cfg %+v, err %v", cfg, err)
		}
	})

	t.Run("the YAML keys set remote pool mode", func(t *testing.T) {
		config := writeFile(t, "config.yaml", "pool-api: https://10.0.0.5:8090\npool-token-file: "+token+"\n")
		cfg, err := runConfig(t, "--config", config)
		if err != nil || cfg.PoolAPI != "https://10.0.0.5:8090" || cfg.poolToken != "pool-s3cret" {
			t.Fatalf("cfg %+v, err %v", cfg, err)
		}
	})

	t.Run("a Redis store's outage grace is the flag's, the default 5m, and 0 turns it off", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want time.Duration
		}{
			{nil, 5 * time.Minute},
			{[]string{"--pool-outage-grace", "90s", "--pool-refresh-interval", "5s"}, 90 * time.Second},
			{[]string{"--pool-outage-grace", "0"}, 0},
		} {
			cfg, err := runConfig(t, append([]string{"--lease-store", "redis://127.0.0.1:6379"}, tc.args...)...)
			if err != nil || cfg.OutageGrace != tc.want || cfg.PoolRefresh <= 0 {
				t.Fatalf("%v: cfg %+v, err %v; want an outage grace of %s", tc.args, cfg, err, tc.want)
			}
		}
	})

	t.Run("no token file means no token", func(t *testing.T) {
		cfg, err := runConfig(t, "--lease-api", "http://127.0.0.1:8090")
		if err != nil || cfg.poolToken != "" {
			t.Fatalf("cfg %+v, err %v", cfg, err)
		}
	})

	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
		deny string
	}{
		{name: "with --upstream", args: []string{"--lease-api", "http://127.0.0.1:8090", "--upstream", "http://127.0.0.1:3128"},
			want: "--lease-api and --upstream exclude each other"},
		{name: "with --upstreams-file", args: []string{"--lease-api", "http://127.0.0.1:8090", "--upstreams-file", upstreams},
			want: "--lease-api and --upstreams-file exclude each other"},
		{name: "with --egress-addr", args: []string{"--lease-api", "http://127.0.0.1:8090", "--egress-addr", "127.0.0.2"},
			want: "--lease-api and --egress-addr exclude each other"},
		{name: "with --probe-url", args: []string{"--lease-api", "http://127.0.0.1:8090", "--probe-url", "http://example.com/"},
			want: "--lease-api and --probe-url exclude each other"},
		{name: "with --lease-api-listen", args: []string{"--lease-api", "http://127.0.0.1:8090", "--lease-api-listen", "127.0.0.1:8091"},
			want: "--lease-api and --lease-api-listen exclude each other"},
		{name: "with an upstream from the environment", args: []string{"--lease-api", "http://127.0.0.1:8090"},
			env: map[string]string{"PROXYFLEET_UPSTREAM": "http://127.0.0.1:3128"}, want: "--lease-api and --upstream exclude each other"},
		{name: "a store flag the controller decides", args: []string{"--lease-api", "http://127.0.0.1:8090", "--cooldown", "5m"},
			want: "--cooldown has no effect with --lease-api"},
		{name: "a store flag from the environment", args: []string{"--lease-api", "http://127.0.0.1:8090"},
			env: map[string]string{"PROXYFLEET_MAX_LEASES_PER_MEMBER": "3"}, want: "--max-leases-per-member has no effect with --lease-api"},
		{name: "token file without --lease-api", args: []string{"--pool-token-file", token},
			want: "--pool-token-file needs --lease-api"},
		{name: "token file with two tokens", args: []string{"--lease-api", "http://127.0.0.1:8090", "--pool-token-file", two},
			want: "--pool-token-file", deny: "\na\n"},
		{name: "outage grace on the in-memory store", args: []string{"--pool-outage-grace", "1m"},
			want: "--pool-outage-grace needs --lease-api or a Redis --lease-store"},
		{name: "refresh interval on the in-memory store", args: []string{"--pool-refresh-interval", "5s"},
			want: "--pool-refresh-interval needs --lease-api or a Redis --lease-store"},
		{name: "a negative outage grace on a Redis store", args: []string{"--lease-store", "redis://127.0.0.1:6379", "--pool-outage-grace", "-1s"},
			want: "--pool-outage-grace -1s: must be 0 (off) or more"},
		{name: "a negative outage grace", args: []string{"--lease-api", "http://127.0.0.1:8090", "--pool-outage-grace", "-1s"},
			want: "--pool-outage-grace -1s: must be 0 (off) or more"},
		{name: "a zero refresh interval", args: []string{"--lease-api", "http://127.0.0.1:8090", "--pool-refresh-interval", "0s"},
			want: "--pool-refresh-interval 0s: must be positive"},
		{name: "not an http URL", args: []string{"--lease-api", "ftp://127.0.0.1:8090"}, want: "--lease-api"},
		{name: "credentials in the URL are refused and never echoed", args: []string{"--lease-api", "http://bob:hunter2@127.0.0.1:8090"},
			want: "--lease-api", deny: "hunter2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			cfg, err := runConfig(t, tt.args...)
			if err == nil || cfg != nil {
				t.Fatalf("accepted %v (cfg %v), want an error", tt.args, cfg != nil)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
			if tt.deny != "" && strings.Contains(err.Error(), tt.deny) {
				t.Fatalf("error %q leaks %q", err, tt.deny)
			}
		})
	}

	t.Run("a conflicting flag from the YAML file", func(t *testing.T) {
		config := writeFile(t, "config.yaml", "upstream: [http://127.0.0.1:3128]\n")
		_, err := runConfig(t, "--config", config, "--lease-api", "http://127.0.0.1:8090")
		if err == nil || !strings.Contains(err.Error(), "--lease-api and --upstream exclude each other") {
			t.Fatalf("error = %v", err)
		}
	})
}

// leaseServer is a controller's lease API stand-in: a real pool.Store behind
// the real leaseapi.NewAPIServer, on a loopback port.
type leaseServer struct {
	store *pool.Store
	srv   *http.Server
	url   string
}

func startLeaseServer(t *testing.T, token string, members ...pool.Member) *leaseServer {
	t.Helper()
	store := pool.NewStore(pool.StoreOptions{})
	store.SetMembers(members)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ls := &leaseServer{
		store: store,
		srv:   &http.Server{Handler: leaseapi.NewAPIServer(store, leaseapi.APIOptions{Token: token}), ReadHeaderTimeout: 10 * time.Second},
		url:   "http://" + ln.Addr().String(),
	}
	go func() { _ = ls.srv.Serve(ln) }()
	t.Cleanup(func() { _ = ls.srv.Close() })
	return ls
}

// cooling reports the targets member cools down for in the store.
func (ls *leaseServer) cooling(member string) []string {
	var out []string
	for _, ms := range ls.store.Members() {
		if ms.Name == member {
			for target := range ms.Cooldowns {
				out = append(out, target)
			}
		}
	}
	return out
}

// sessionGet GETs u through the gateway at proxy as session, and returns
// the status, the source address the target saw, the gateway's reason
// header and the body.
func sessionGet(t *testing.T, proxy, session, u string) (int, string, string, string) {
	t.Helper()
	c := testutil.MustProxyClient(t, "http://"+proxy, nil)
	hdr := http.Header{gateway.HeaderSession: {session}}
	resp, a, err := testutil.GetAnswer(c, u, hdr)
	if resp == nil {
		t.Fatalf("GET %s as %s: %v", u, session, err)
	}
	reason := resp.Header.Get(gateway.HeaderReason)
	if err != nil {
		// Not a target answer: the gateway's own, whose text the error carries.
		return resp.StatusCode, "", reason, err.Error()
	}
	return resp.StatusCode, a.Source, reason, ""
}

func TestGatewaysSharingTheLeaseAPIShareCooldowns(t *testing.T) {
	const apiToken = "controller-t0ken"
	tokenFile := writeFile(t, "pool-token", apiToken+"\n")
	// Two direct members leaving from distinct loopback addresses, so the
	// target sees which one carried a request.
	m2 := pool.Member{Name: "egress-2", SourceAddr: netip.MustParseAddr("127.0.0.2")}
	m3 := pool.Member{Name: "egress-3", SourceAddr: netip.MustParseAddr("127.0.0.3")}
	api := startLeaseServer(t, apiToken, m2, m3)

	args := func(extra ...string) []string {
		return append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "off", "--allow-private-targets",
			"--lease-api", api.url, "--pool-token-file", tokenFile, "--shutdown-grace", "2s"}, extra...)
	}
	// A pins a member per (session, target) for 3s and has no last-known
	// pool; B leases per request, with one.
	gwA := startGateway(t, args("--lease-ttl", "3s", "--pool-outage-grace", "0")...)
	gwB := startGateway(t, args("--rotation", "per-request")...)
	if out := gwA.Stderr.String(); !strings.Contains(out, "leasing from the lease API "+api.url) || strings.Contains(out, apiToken) {
		t.Fatalf("startup message should name the pool API and never the token:\n%s", out)
	}

	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	other := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.41"})
	siteKey := rotation.TargetKey(site.Addr())
	site.SetRule("127.0.0.2", http.StatusTooManyRequests, nil)

	t.Run("a 429 seen through gateway A cools the member down in the controller", func(t *testing.T) {
		// Sessions lease afresh until one lands on egress-2 and is
		// rate-limited; the retry moves it to egress-3.
		for i := 0; site.Count("127.0.0.2") == 0; i++ {
			if i == 20 {
				t.Fatalf("20 sessions through A never used egress-2: %v", site.Counts())
			}
			code, src, _, body := sessionGet(t, gwA.Proxy, fmt.Sprintf("a%d", i), site.URL())
			if code != http.StatusOK || src != "127.0.0.3" {
				t.Fatalf("session a%d through A: %d from %q %s, want 200 from 127.0.0.3 (the retry)", i, code, src, body)
			}
		}
		if got := api.cooling(m2.Name); len(got) != 1 || got[0] != siteKey {
			t.Fatalf("egress-2 cools down for %v in the controller, want [%s]", got, siteKey)
		}
	})

	t.Run("gateway B then avoids that member for that target only", func(t *testing.T) {
		before := site.Count("127.0.0.2")
		for i := range 6 {
			code, src, _, body := sessionGet(t, gwB.Proxy, fmt.Sprintf("b%d", i), site.URL())
			if code != http.StatusOK || src != "127.0.0.3" {
				t.Fatalf("session b%d through B: %d from %q %s, want 200 from 127.0.0.3", i, code, src, body)
			}
		}
		if n := site.Count("127.0.0.2"); n != before {
			t.Fatalf("B sent %d requests through the cooled egress-2", n-before)
		}
		// For another target egress-2 is fine: leases spread over both.
		seen := map[string]bool{}
		for i := range 6 {
			code, src, _, body := sessionGet(t, gwB.Proxy, fmt.Sprintf("o%d", i), other.URL())
			if code != http.StatusOK {
				t.Fatalf("other target through B: %d %s", code, body)
			}
			seen[src] = true
		}
		if !seen["127.0.0.2"] {
			t.Fatalf("egress-2 never carried the other target (sources %v); its cooldown should be for %s only", seen, siteKey)
		}
	})

	t.Run("leases are released when done: per-request ones and the rate-limited one", func(t *testing.T) {
		// Only A's pins on egress-3 hold leases; B's 60s leases and A's
		// rate-limited lease on egress-2 went back to the controller.
		poll.Until(t, 20*time.Second, "the released leases back at the controller", func() error {
			for _, ms := range api.store.Members() {
				if ms.Name == m2.Name && ms.ActiveLeases != 0 {
					return fmt.Errorf("egress-2 holds %d active leases, want 0", ms.ActiveLeases)
				}
			}
			return nil
		})
	})

	t.Run("without the lease API and a last-known pool a pinned session works until its TTL, then 503", func(t *testing.T) {
		code, src, _, body := sessionGet(t, gwA.Proxy, "pinned", other.URL())
		if code != http.StatusOK {
			t.Fatalf("pinning a session: %d %s", code, body)
		}
		pinnedAt := time.Now()
		if err := api.srv.Close(); err != nil {
			t.Fatal(err)
		}
		if code, got, _, body := sessionGet(t, gwA.Proxy, "pinned", other.URL()); code != http.StatusOK || got != src {
			t.Fatalf("pinned session right after the API went away: %d from %q %s, want 200 from %s", code, got, body, src)
		}
		if code, _, reason, body := sessionGet(t, gwA.Proxy, "new-session", other.URL()); code != http.StatusServiceUnavailable ||
			reason != "pool_unreachable" || !strings.Contains(body, "lease API unreachable") {
			t.Fatalf("a session without a lease: %d %s %q, want 503 pool_unreachable", code, reason, body)
		}
		// The pin ends with its 3s lease; until then every request works.
		var code503 int
		var reason, msg string
		poll.Until(t, 30*time.Second, "the pin to end with its lease", func() error {
			code503, _, reason, msg = sessionGet(t, gwA.Proxy, "pinned", other.URL())
			if code503 == http.StatusOK {
				return fmt.Errorf("still served %s after the API went away", time.Since(pinnedAt).Round(time.Millisecond))
			}
			return nil
		})
		if elapsed := time.Since(pinnedAt); elapsed < 2*time.Second {
			t.Fatalf("the pinned session failed after %s, before its 3s lease ended", elapsed)
		}
		if code503 != http.StatusServiceUnavailable || reason != "pool_unreachable" || !strings.Contains(msg, "lease API unreachable") {
			t.Fatalf("after the lease ended: %d %s %q, want 503 saying the pool API is unreachable", code503, reason, msg)
		}
	})

	t.Run("without the lease API a gateway with a last-known pool serves new sessions from it", func(t *testing.T) {
		for i := range 4 {
			if code, src, reason, body := sessionGet(t, gwB.Proxy, fmt.Sprintf("after%d", i), other.URL()); code != http.StatusOK ||
				(src != "127.0.0.2" && src != "127.0.0.3") {
				t.Fatalf("a new session through B with the API gone: %d from %q %s %q, want 200 from a last-known member", code, src, reason, body)
			}
		}
	})

	for _, g := range []*daemontest.Gateway{gwA, gwB} {
		if err := g.Stop(t); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if strings.Contains(g.Stderr.String(), apiToken) {
			t.Errorf("the pool API token reached the log:\n%s", g.Stderr.String())
		}
	}
}

func TestGatewayWarnsWhenThePoolAPIRefusesItsToken(t *testing.T) {
	api := startLeaseServer(t, "right-token", pool.DirectMember())
	wrong := writeFile(t, "pool-token", "wrong-token\n")
	g := startGateway(t, "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--lease-api", api.url, "--pool-token-file", wrong)
	poll.Until(t, 20*time.Second, "the warning about the refused token", func() error {
		if !strings.Contains(g.Stderr.String(), "the lease API refused the token") {
			return fmt.Errorf("no warning about the refused token yet:\n%s", g.Stderr.String())
		}
		return nil
	})
	if strings.Contains(g.Stderr.String(), "wrong-token") {
		t.Fatalf("the token reached the log:\n%s", g.Stderr.String())
	}
}
