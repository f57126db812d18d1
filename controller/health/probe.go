package health

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/probe"
)

// probeThrough fetches target through the proxy at proxyURL (scheme http, https or
// socks5, with the login the proxy demands in its user info) and succeeds
// when the answer's status is expect, within timeout. Errors name the proxy
// by host:port only, and never carry its password.
//
// The fetch is probe.Fetch, the gateway's probe too: a fresh transport with
// keep-alives off for every probe, so every probe re-exercises the proxy's
// accept path and (for https) its CONNECT tunnel; never HTTP_PROXY from the
// environment; redirects not followed, the first answer's status is the
// verdict.
func probeThrough(ctx context.Context, proxyURL *url.URL, target *url.URL, expect int, timeout time.Duration, tlsConf *tls.Config) error {
	addr := proxyURL.Host
	res, err := probe.Fetch(ctx, probe.Request{
		Target:    target,
		Proxy:     proxyURL,
		Timeout:   timeout,
		TLSConfig: tlsConf,
		UserAgent: "proxyfleet-health",
	})
	if err != nil {
		if res.TimedOut {
			return fmt.Errorf("GET %s through %s: no answer within %s", redact.Parsed(target), addr, timeout)
		}
		return fmt.Errorf("GET %s through %s: %w", redact.Parsed(target), addr, err)
	}
	status := res.Answer.StatusCode
	if status == http.StatusProxyAuthRequired && expect != http.StatusProxyAuthRequired {
		if proxyURL.User == nil {
			return fmt.Errorf("GET %s through %s answered 407: the proxy demands a login and the Proxy has none", redact.Parsed(target), addr)
		}
		return fmt.Errorf("GET %s through %s answered 407: the proxy refused the Proxy's login (user %q)", redact.Parsed(target), addr, proxyURL.User.Username())
	}
	if status != expect {
		return fmt.Errorf("GET %s through %s answered %d, want %d", redact.Parsed(target), addr, status, expect)
	}
	return nil
}
