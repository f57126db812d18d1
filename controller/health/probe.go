package health

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// maxProbeBody is how much of a probe answer is read before the connection
// is closed; the status code is all that counts.
const maxProbeBody = 64 << 10

// probe fetches target through the proxy at proxyURL (scheme http, https or
// socks5, with the login the proxy demands in its user info) and succeeds
// when the answer's status is expect, within timeout. Errors name the proxy
// by host:port only, and never carry its password.
//
// Every probe builds a fresh transport with keep-alives off. That is
// load-bearing: a kept-alive connection would cache the proxy connection (and
// for https the CONNECT tunnel), so later probes would never re-exercise the
// proxy's accept path or its tunnel setup and a wedged proxy could look
// healthy. An https target goes through CONNECT with TLS inside, which Go's
// transport does for an http:// proxy. The proxy is always addr, never one
// from the environment (HTTP_PROXY does not apply to probes). Redirects are
// not followed: the first answer's status is the verdict.
func probe(ctx context.Context, proxyURL *url.URL, target *url.URL, expect int, timeout time.Duration, tlsConf *tls.Config) error {
	err := probeThrough(ctx, proxyURL, target, expect, timeout, tlsConf)
	if err == nil || proxyURL.User == nil {
		return err
	}
	if pw, ok := proxyURL.User.Password(); ok && pw != "" && strings.Contains(err.Error(), pw) {
		return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
	}
	return err
}

func probeThrough(ctx context.Context, proxyURL *url.URL, target *url.URL, expect int, timeout time.Duration, tlsConf *tls.Config) error {
	addr := proxyURL.Host
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tr := &http.Transport{
		Proxy:                  http.ProxyURL(proxyURL),
		DialContext:            (&net.Dialer{Timeout: timeout}).DialContext,
		DisableKeepAlives:      true,
		TLSClientConfig:        tlsConf.Clone(),
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: maxProbeBody,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.String(), nil)
	if err != nil {
		return fmt.Errorf("GET %s: %w", target.Redacted(), err)
	}
	req.Header.Set("User-Agent", "proxyfleet-health")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("GET %s through %s: no answer within %s", target.Redacted(), addr, timeout)
		}
		return fmt.Errorf("GET %s through %s: %w", target.Redacted(), addr, err)
	}
	_, _ = io.CopyN(io.Discard, resp.Body, maxProbeBody)
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusProxyAuthRequired && expect != http.StatusProxyAuthRequired {
		if proxyURL.User == nil {
			return fmt.Errorf("GET %s through %s answered 407: the proxy demands a login and the Proxy has none", target.Redacted(), addr)
		}
		return fmt.Errorf("GET %s through %s answered 407: the proxy refused the Proxy's login (user %q)", target.Redacted(), addr, proxyURL.User.Username())
	}
	if resp.StatusCode != expect {
		return fmt.Errorf("GET %s through %s answered %d, want %d", target.Redacted(), addr, resp.StatusCode, expect)
	}
	return nil
}
