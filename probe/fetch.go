package probe

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// MaxBody is how much of a probe answer is read before the connection is
// closed; the status code is all that counts. It also bounds the answer's
// headers.
const MaxBody = 64 << 10

// Request is one probe.
type Request struct {
	// Target is fetched with GET (an absolute http:// or https:// URL).
	Target *url.URL
	// Proxy is the proxy to fetch Target through (scheme http, https or
	// socks5, with its login in the user info). Nil fetches Target
	// directly, from LocalAddr when that is set.
	Proxy *url.URL
	// LocalAddr is the source address of a direct fetch.
	LocalAddr netip.Addr
	// Timeout bounds everything: dialling, CONNECT, TLS and the answer's
	// headers.
	Timeout time.Duration
	// TLSConfig verifies an https Target (nil: the system roots).
	TLSConfig *tls.Config
	// UserAgent is sent as User-Agent.
	UserAgent string
}

// Answer is what a probe that reached an answer saw.
type Answer struct {
	// StatusCode and Status are the first answer's (redirects are not
	// followed).
	StatusCode int
	Status     string
}

// Result is the outcome of Fetch.
type Result struct {
	// Answer is set when err is nil.
	Answer Answer
	// Latency is the round trip, from sending the request to the answer's
	// headers (or the failure).
	Latency time.Duration
	// TimedOut says the failure was the Timeout running out.
	TimedOut bool
}

// Fetch sends GET r.Target through r.Proxy and returns the answer's status,
// or the transport's error with the proxy's password replaced by xxxxx.
//
// Every probe builds a fresh transport with keep-alives off. That is
// load-bearing: a kept-alive connection would cache the proxy connection (and
// for https the CONNECT tunnel), so later probes would never re-exercise the
// proxy's accept path or its tunnel setup and a wedged proxy could look
// healthy. An https target goes through CONNECT with TLS inside, which Go's
// transport does for an http:// proxy. The proxy is always r.Proxy, never one
// from the environment (HTTP_PROXY does not apply to probes).
func Fetch(ctx context.Context, r Request) (Result, error) {
	dialer := &net.Dialer{Timeout: r.Timeout}
	tr := &http.Transport{
		DialContext:            dialer.DialContext,
		DisableKeepAlives:      true,
		TLSClientConfig:        r.TLSConfig.Clone(),
		TLSHandshakeTimeout:    r.Timeout,
		ResponseHeaderTimeout:  r.Timeout,
		MaxResponseHeaderBytes: MaxBody,
	}
	if r.Proxy != nil {
		tr.Proxy = http.ProxyURL(r.Proxy)
	} else if r.LocalAddr.IsValid() {
		dialer.LocalAddr = &net.TCPAddr{IP: r.LocalAddr.AsSlice(), Zone: r.LocalAddr.Zone()}
	}
	defer tr.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.Target.String(), nil)
	if err != nil {
		return Result{}, ScrubPassword(err, r.Proxy)
	}
	req.Header.Set("User-Agent", r.UserAgent)
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	res := Result{Latency: time.Since(start)}
	if err != nil {
		res.TimedOut = errors.Is(err, context.DeadlineExceeded) || ctx.Err() == context.DeadlineExceeded
		return res, ScrubPassword(err, r.Proxy)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, MaxBody))
	_ = resp.Body.Close()
	res.Answer = Answer{StatusCode: resp.StatusCode, Status: resp.Status}
	return res, nil
}

// ScrubPassword keeps proxy's password out of an error that might be logged
// or shown in a condition (transport errors normally do not carry it; this
// makes sure).
func ScrubPassword(err error, proxy *url.URL) error {
	if err == nil || proxy == nil || proxy.User == nil {
		return err
	}
	pw, ok := proxy.User.Password()
	if !ok || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
}
