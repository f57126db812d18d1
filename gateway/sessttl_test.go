package gateway

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
)

// TestSessTTLBoundsHowLongASessionKeepsItsLease checks the positive side of
// the sessttl parameter: a session that asks
// for a one-second TTL keeps its lease while it lasts and gets a new one
// after, while a session on the gateway's own --lease-ttl keeps its lease.
func TestSessTTLBoundsHowLongASessionKeepsItsLease(t *testing.T) {
	tests := []struct {
		name string
		user string
		hdr  http.Header
	}{
		{name: "sessttl in the username", user: "u-session-short-sessttl-1"},
		{name: "sessttl as a header", user: "v", hdr: http.Header{HeaderSession: {"short"}, HeaderSessTTL: {"1s"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, Options{AllowPrivateTargets: true, LeaseTTL: time.Minute}, pool.StoreOptions{}, directMembers(1)...)
			tg := testutil.StartTarget(t, testutil.TargetOptions{})
			leaseOf := func(c *http.Client, hdr http.Header) string {
				t.Helper()
				resp, _ := get(t, c, tg.URL(), hdr)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderLease) == "" {
					t.Fatalf("status %d, lease %q: want 200 with a lease", resp.StatusCode, resp.Header.Get(HeaderLease))
				}
				return resp.Header.Get(HeaderLease)
			}
			short, long := e.client(tt.user, ""), e.client("u-session-long", "")
			first := leaseOf(short, tt.hdr)
			if again := leaseOf(short, tt.hdr); again != first {
				t.Fatalf("the next request of the session got lease %s, want its lease %s kept", again, first)
			}
			longFirst := leaseOf(long, nil)
			poll.Until(t, 20*time.Second, "the 1s session to lose its first lease", func() error {
				if leaseOf(short, tt.hdr) == first {
					return errors.New("the session with sessttl 1s still holds its first lease")
				}
				return nil
			})
			if got := leaseOf(long, nil); got != longFirst {
				t.Fatalf("the session on the 1m --lease-ttl changed lease from %s to %s", longFirst, got)
			}
		})
	}
}
