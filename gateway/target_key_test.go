package gateway

import (
	"testing"

	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// The gateway keys leases with rotation.HostKey of the host splitTarget
// returns; that must be the same site key the lease API computes with
// rotation.TargetKey from the raw host[:port].
func TestSplitHostKeyMatchesTargetKey(t *testing.T) {
	for _, hostport := range []string{
		"Example.COM", "example.com:443", "example.com.", "Example.com.:8080", "192.0.2.1:80",
		"[2001:DB8::1]:443", "[::1]", "[0:0::1]:80", "::ffff:192.0.2.1",
	} {
		t.Run(hostport, func(t *testing.T) {
			host, _, err := sites.SplitTarget(hostport, "80")
			if err != nil {
				t.Fatalf("sites.SplitTarget(%q): %v", hostport, err)
			}
			if got, want := rotation.HostKey(host), rotation.TargetKey(hostport); got != want {
				t.Fatalf("HostKey(%q) = %q, TargetKey(%q) = %q", host, got, hostport, want)
			}
		})
	}
}
