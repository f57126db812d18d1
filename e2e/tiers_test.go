package e2e

import (
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// TestGatewaysOnOneStoreShareASitesTier: two gateway processes with
// --tiers own,residential on one real redis-server, in front of two Squids
// of tier own (one named by its line, one left to the default) and one of
// tier residential, against a site that bans every own address. The first
// gateway's first request climbs the site (two bans) and is served on
// residential; the second gateway, which never saw a ban, starts the site
// on residential once the own members' cooldowns are over, and another
// site stays on own. Bad tier flags and an upstream of a tier the gateway
// does not have stop a gateway at start, naming them.
func TestGatewaysOnOneStoreShareASitesTier(t *testing.T) {
	bin := testutil.BuildBinary(t)
	squids := startSquids(t, "tiers", "127.0.0.241", "127.0.0.242", "127.0.0.243")
	rdb := redis.Start(t, redis.Options{})
	upstreams := squids[0].URL() + " name=own-1 tier=own\n" +
		squids[1].URL() + " name=own-2\n" +
		squids[2].URL() + " name=res-1 tier=residential\n"
	cfg := gwConfig{upstreamsFile: upstreams, rotation: "request", args: []string{
		"--lease-store", rdb.URL(), "--lease-store-prefix", "e2e-tier", "--cooldown", "1s", "--max-cooldown", "1s",
		"--tiers", "own,residential", "--tier-escalate-bans", "2", "--tier-hold", "1h"}}
	siteA := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.244"})
	siteB := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.245"})
	siteA.SetRule("127.0.0.241", http.StatusForbidden, nil)
	siteA.SetRule("127.0.0.242", http.StatusForbidden, nil)

	first := startGateway(t, bin, cfg)
	r, err := doGet(first.client(t, "", nil), siteA.URL()+"/first", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != 200 || r.header.Get("X-Proxyfleet-Tier") != "residential" || r.header.Get("X-Proxyfleet-Attempts") != "3" || r.header.Get(hdrProxy) != "res-1" {
		t.Fatalf("the first gateway's first request to A: %d via %s, tier %q, %s attempts; want 200 on residential after two bans on own",
			r.status, r.header.Get(hdrProxy), r.header.Get("X-Proxyfleet-Tier"), r.header.Get("X-Proxyfleet-Attempts"))
	}
	ownSeen := siteA.Count("127.0.0.241") + siteA.Count("127.0.0.242")
	if ownSeen != 2 {
		t.Fatalf("site A saw %d requests from own members, want the 2 it banned", ownSeen)
	}

	second := startGateway(t, bin, cfg)
	time.Sleep(1500 * time.Millisecond) // the own members' 1s cooldowns end
	c2 := second.client(t, "", nil)
	for i := range 3 {
		r := mustGetOK(t, c2, siteA.URL()+"/second", nil)
		if r.header.Get("X-Proxyfleet-Tier") != "residential" || r.header.Get("X-Proxyfleet-Attempts") != "1" {
			t.Fatalf("the second gateway's request %d to A: tier %q, %s attempts; want residential at once, as the first learnt",
				i+1, r.header.Get("X-Proxyfleet-Tier"), r.header.Get("X-Proxyfleet-Attempts"))
		}
	}
	if n := siteA.Count("127.0.0.241") + siteA.Count("127.0.0.242"); n != ownSeen {
		t.Fatalf("the second gateway sent %d requests to A through own members", n-ownSeen)
	}
	for i := range 4 {
		r := mustGetOK(t, c2, siteB.URL()+"/b", nil)
		if tier, via := r.header.Get("X-Proxyfleet-Tier"), r.header.Get(hdrProxy); tier != "own" || (via != "own-1" && via != "own-2") {
			t.Fatalf("request %d to B: via %s on %q, want an own member", i+1, via, tier)
		}
	}

	t.Run("bad tiers stop the gateway at start", func(t *testing.T) {
		dir := t.TempDir()
		bad := filepath.Join(dir, "upstreams.txt")
		writeFile(t, bad, squids[0].URL()+" name=m tier=mobile\n")
		for _, tc := range []struct {
			name string
			args []string
			want string
		}{
			{"a gap in --tiers", []string{"--upstream", squids[0].URL(), "--tiers", "own,,residential"}, "--tiers: tier 2 of"},
			{"a probe rarer than the hold", []string{"--upstream", squids[0].URL(), "--tiers", "own,residential", "--tier-hold", "1m", "--tier-probe-every", "2m"}, "--tier-probe-every 2m0s: must be above 0 and at most --tier-hold (1m0s)"},
			{"no bans escalate", []string{"--upstream", squids[0].URL(), "--tiers", "own,residential", "--tier-escalate-bans", "0"}, "--tier-escalate-bans 0: must be 1 to"},
			{"an upstream of another tier", []string{"--upstreams-file", bad, "--tiers", "own,residential"}, `member m: tier "mobile" is not one of --tiers own,residential`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				args := append([]string{"gateway", "--listen", "127.0.0.1:0", "--metrics-listen", "off"}, tc.args...)
				out, err := exec.Command(bin, args...).CombinedOutput()
				if err == nil || !strings.Contains(string(out), tc.want) {
					t.Fatalf("%v: %v\n%s\nwant a refusal to start with %q", tc.args, err, out, tc.want)
				}
			})
		}
	})
}
