package main

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
)

// TestAPoolAPIGatewayReportsUpstreamFailuresToTheController checks the other
// half of "reports every ban and upstream failure": an upstream that refuses
// connections is reported to the controller, which takes it out for every
// target (cooldown target ""), so every gateway leasing there stops using it.
func TestAPoolAPIGatewayReportsUpstreamFailuresToTheController(t *testing.T) {
	const apiToken = "controller-t0ken"
	tokenFile := writeFile(t, "pool-token", apiToken+"\n")
	// A port that refuses connections: listened on, then closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()
	dead := pool.Member{Name: "dead", URL: &url.URL{Scheme: "http", Host: deadAddr}}
	live := pool.Member{Name: "egress-2", SourceAddr: netip.MustParseAddr("127.0.0.2")}
	api := startLeaseServer(t, apiToken, dead, live)
	gw := startGateway(t, "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--allow-private-targets",
		"--lease-api", api.url, "--pool-token-file", tokenFile, "--rotation", "per-request", "--shutdown-grace", "2s")
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})

	// Per-request leases: the least-leased member comes first, so within a
	// few requests one lands on the dead member and is retried on egress-2.
	for i := 0; len(api.cooling(dead.Name)) == 0; i++ {
		if i == 10 {
			t.Fatalf("10 requests never reported %s to the controller; cooldowns %v", dead.Name, api.store.Members())
		}
		code, src, _, body := sessionGet(t, gw.Proxy, fmt.Sprintf("s%d", i), site.URL())
		if code != http.StatusOK || src != "127.0.0.2" {
			t.Fatalf("request %d: %d from %q %s, want 200 from 127.0.0.2", i, code, src, body)
		}
	}
	if got := api.cooling(dead.Name); !slices.Equal(got, []string{""}) {
		t.Fatalf("the dead member cools down for %q, want every target (\"\")", got)
	}
	// The failed lease went back to the controller too.
	poll.Until(t, 20*time.Second, "the failed lease back at the controller", func() error {
		for _, ms := range api.store.Members() {
			if ms.Name == dead.Name && ms.ActiveLeases != 0 {
				return fmt.Errorf("%s holds %d active leases, want 0", dead.Name, ms.ActiveLeases)
			}
		}
		return nil
	})
	if err := gw.Stop(t); err != nil {
		t.Fatalf("stop: %v", err)
	}
}
