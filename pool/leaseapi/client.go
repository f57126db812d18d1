package leaseapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/keepalive"
	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/pool"
)

// maxClientResponseBytes bounds how much of an answer the client reads; a
// list of thousands of members fits easily.
const maxClientResponseBytes = 32 << 20

// APIError is an answer of the lease API the client has no sentinel for
// (401, 400 bad_request, 5xx, ...). Status and Code say what the server said.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Code is the body's "error" field (unauthorized, bad_request, ...).
	Code string
	// Message is the body's "message" field, or the raw body if it was not JSON.
	Message string
}

// Error says what the server answered.
func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("lease API: HTTP %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("lease API: HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// Unwrap makes a gateway-style answer (502, 503, 504 from something between
// us and the API) count as ErrUnreachable, and a 403 (an identity without
// the right to lease) as ErrForbidden.
func (e *APIError) Unwrap() error {
	switch e.Status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return pool.ErrUnreachable
	case http.StatusForbidden:
		return pool.ErrForbidden
	}
	return nil
}

// Client is a Pool backed by a remote lease API (a controller, or a
// standalone gateway's --lease-api-listen). It is safe for concurrent use and keeps
// connections alive, so a gateway can call it on every new (session, target).
type Client struct {
	bases    []string // scheme://host[:port][/prefix], no trailing slash; one per replica or Service
	next     atomic.Uint32
	auth     string // "Bearer <token>" or ""
	httpc    *http.Client
	lean     map[string]*keepalive.Pool // http:// bases without a caller's HTTPClient (lean.go)
	tokens   *tokenFile                 // re-read token, when set (instead of auth)
	selector map[string]string          // merged under every Acquire's selector
}

// ClientOptions are NewClientWith's settings beyond the URL.
type ClientOptions struct {
	// Token is a fixed bearer token (empty: none).
	Token string
	// TokenFile is a file holding the bearer token, re-read every
	// TokenFileRefresh: a projected service-account token, which the kubelet
	// rotates in place. It excludes Token.
	TokenFile string
	// HTTPClient is as in NewClient; nil gets a keep-alive client.
	HTTPClient *http.Client
	// TokenFileRefresh is how often TokenFile is re-read (default
	// TokenFileRefresh).
	TokenFileRefresh time.Duration
	// Selector is a default attribute selector merged under every Acquire's
	// (a key the request names wins), so a sidecar can confine its pod to a
	// part of the fleet without every crawler request saying so.
	Selector map[string]string
}

// TokenFileRefresh is how often a ClientOptions.TokenFile is re-read: well
// inside the shortest projected token lifetime (10 minutes, rotated at 80%).
const TokenFileRefresh = 30 * time.Second

var _ pool.Pool = (*Client)(nil)

// NewClient validates baseURL (http or https, a host, no query) and returns a
// client sending token as a bearer token (empty: none). httpClient nil gets a
// keep-alive client of its own. The transport never uses HTTP(S)_PROXY from
// the environment — the API usually sits beside that very proxy — so an
// *http.Transport with a Proxy func is cloned without it.
//
// baseURL may list several lease API URLs, comma-separated (controller
// replicas on one shared store): calls go to one of them, and a call that
// fails on the connection level is retried once on the next one. Acquire
// carries an idempotency key, so the retry never takes a second lease.
func NewClient(baseURL, token string, httpClient *http.Client) (*Client, error) {
	return NewClientWith(baseURL, ClientOptions{Token: token, HTTPClient: httpClient})
}

// NewClientWith is NewClient with the options of ClientOptions. A TokenFile
// must be readable and hold one token now; later read failures keep the last
// good token (the kubelet swaps the file atomically, so that is rare).
func NewClientWith(baseURL string, o ClientOptions) (*Client, error) {
	token, httpClient := o.Token, o.HTTPClient
	c := &Client{selector: o.Selector}
	for raw := range strings.SplitSeq(baseURL, ",") {
		base, err := parseAPIBase(strings.TrimSpace(raw))
		if err != nil {
			return nil, err
		}
		c.bases = append(c.bases, base)
	}
	if strings.ContainsAny(token, "\r\n") {
		return nil, errors.New("lease API token contains a line break")
	}
	if token != "" {
		c.auth = "Bearer " + token
	}
	if o.TokenFile != "" {
		if token != "" {
			return nil, errors.New("lease API client: a fixed token and a token file exclude each other")
		}
		tf := &tokenFile{path: o.TokenFile, every: o.TokenFileRefresh}
		if tf.every <= 0 {
			tf.every = TokenFileRefresh
		}
		if _, err := tf.read(); err != nil {
			return nil, err
		}
		c.tokens = tf
	}
	if httpClient == nil {
		c.httpc = &http.Client{Transport: newAPITransport(), Timeout: requestTimeout}
		c.lean = leanPools(c.bases)
		return c, nil
	}
	hc := *httpClient
	switch tr := hc.Transport.(type) {
	case nil:
		hc.Transport = newAPITransport()
	case *http.Transport:
		if tr.Proxy != nil {
			clone := tr.Clone()
			clone.Proxy = nil
			hc.Transport = clone
		}
	}
	c.httpc = &hc
	return c, nil
}

// parseAPIBase validates one lease API URL.
func parseAPIBase(baseURL string) (string, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return "", fmt.Errorf("lease API URL %q: %s", redact.URL(baseURL), redact.Reason(baseURL, err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("lease API URL %q: scheme must be http or https", redact.Parsed(u))
	}
	if u.Host == "" {
		return "", fmt.Errorf("lease API URL %q: no host", redact.Parsed(u))
	}
	if u.User != nil {
		return "", fmt.Errorf("lease API URL %q: credentials go in the token, not the URL", redact.Parsed(u))
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("lease API URL %q: no query or fragment allowed", redact.Parsed(u))
	}
	return strings.TrimRight(u.Scheme+"://"+u.Host+u.EscapedPath(), "/"), nil
}

// newAPITransport is a keep-alive transport sized for a gateway calling the
// API from many goroutines, with no environment proxy.
func newAPITransport() *http.Transport {
	return &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: 15 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
	}
}

// Acquire leases a member (POST /v1/leases). A 409 is a *NoMatchError with
// the server's counts; a TTL above the maximum wraps ErrTTLTooLong. TTLs
// are sent in whole seconds, rounded up.
func (c *Client) Acquire(ctx context.Context, req pool.AcquireRequest) (pool.Lease, error) {
	if req.TTL < 0 {
		return pool.Lease{}, fmt.Errorf("lease TTL %s is negative", req.TTL)
	}
	key := req.IdempotencyKey
	if key == "" {
		key = rand.Text()
	}
	sel := req.Selector
	if len(c.selector) > 0 {
		sel = make(map[string]string, len(c.selector)+len(req.Selector))
		for k, v := range c.selector {
			sel[k] = v
		}
		for k, v := range req.Selector {
			sel[k] = v
		}
	}
	body := leaseRequest{
		Selector:       sel,
		TTLSeconds:     ceilSeconds(req.TTL),
		Target:         req.Target,
		Proxy:          req.Proxy,
		IdempotencyKey: key,
	}
	status, raw, err := c.do(ctx, http.MethodPost, "/v1/leases", body)
	if err != nil {
		return pool.Lease{}, err
	}
	switch status {
	case http.StatusCreated:
		var info LeaseInfo
		if err := json.Unmarshal(raw, &info); err != nil {
			return pool.Lease{}, fmt.Errorf("lease API: decoding the lease: %w", err)
		}
		return leaseFromInfo(info)
	case http.StatusConflict:
		var nm noMatchBody
		if err := json.Unmarshal(raw, &nm); err != nil || nm.apiErrorBody.Error != apiErrNoMatch {
			return pool.Lease{}, apiError(status, raw)
		}
		e := nm.NoMatchError
		return pool.Lease{}, &e
	case http.StatusBadRequest:
		apiErr := apiError(status, raw)
		if apiErr.Code == apiErrTTLTooLong {
			return pool.Lease{}, fmt.Errorf("%w: %s", pool.ErrTTLTooLong, apiErr.Message)
		}
		return pool.Lease{}, apiErr
	}
	return pool.Lease{}, apiError(status, raw)
}

func leaseFromInfo(info LeaseInfo) (pool.Lease, error) {
	if info.LeaseID == "" || info.Proxy.Name == "" {
		return pool.Lease{}, errors.New("lease API: lease answer without leaseID or proxy name")
	}
	u, src, err := parseMemberURL(info.Proxy.URL)
	if err != nil {
		return pool.Lease{}, fmt.Errorf("lease API: lease %s: %w", info.LeaseID, err)
	}
	return pool.Lease{
		ID: info.LeaseID,
		Member: pool.Member{
			Name:       info.Proxy.Name,
			URL:        u,
			SourceAddr: src,
			Attributes: info.Proxy.Attributes,
		},
		Target:      info.Target,
		TTL:         time.Duration(info.TTLSeconds) * time.Second,
		ExpiresAt:   info.ExpiresAt,
		FailureRest: info.FailureRest,
	}, nil
}

// Release ends a lease (DELETE /v1/leases/{id}); unknown IDs are not an error.
func (c *Client) Release(ctx context.Context, leaseID string) error {
	if leaseID == "" {
		return errors.New("lease ID is empty")
	}
	status, raw, err := c.do(ctx, http.MethodDelete, "/v1/leases/"+url.PathEscape(leaseID), nil)
	if err != nil {
		return err
	}
	if status != http.StatusNoContent && status != http.StatusOK {
		return apiError(status, raw)
	}
	return nil
}

// Report sends feedback on a lease (POST /v1/leases/{id}/report). A lease
// unknown to the server, or past its report window, is ErrUnknownLease.
func (c *Client) Report(ctx context.Context, leaseID string, r pool.Report) error {
	if leaseID == "" {
		return errors.New("lease ID is empty")
	}
	if r.RetryAfter < 0 {
		return fmt.Errorf("retry-after %s is negative", r.RetryAfter)
	}
	body := reportRequest{
		Result:            string(r.Result),
		Target:            r.Target,
		RetryAfterSeconds: ceilSeconds(r.RetryAfter),
	}
	status, raw, err := c.do(ctx, http.MethodPost, "/v1/leases/"+url.PathEscape(leaseID)+"/report", body)
	if err != nil {
		return err
	}
	switch status {
	case http.StatusNoContent, http.StatusOK:
		return nil
	case http.StatusNotFound:
		if apiErr := apiError(status, raw); apiErr.Code == apiErrUnknownLease {
			return fmt.Errorf("%w: %s", pool.ErrUnknownLease, apiErr.Message)
		}
	}
	return apiError(status, raw)
}

// List returns the members the API offers (GET /v1/proxies), sorted by
// name. URLs are redacted by the server.
func (c *Client) List(ctx context.Context, f ListFilter) ([]ProxyInfo, error) {
	q := url.Values{}
	for k, v := range f.Attributes {
		if k == "" {
			return nil, errors.New("attribute filter with an empty name")
		}
		q.Set("attr."+k, v)
	}
	if f.HealthyOnly {
		q.Set("healthy", "true")
	}
	if f.Credentials {
		q.Set("credentials", "true")
	}
	path := "/v1/proxies"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	status, raw, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, apiError(status, raw)
	}
	var list proxyList
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("lease API: decoding the proxy list: %w", err)
	}
	sort.Slice(list.Proxies, func(i, j int) bool { return list.Proxies[i].Name < list.Proxies[j].Name })
	return list.Proxies, nil
}

// Members lists the members the API offers with their credentials, health
// and cooldowns (GET /v1/proxies?credentials=true), narrowed to the
// client's default selector (ClientOptions.Selector): what a gateway keeps
// as its last-known pool (pool/lastknown). Sorted by name.
func (c *Client) Members(ctx context.Context) ([]pool.MemberStatus, error) {
	list, err := c.List(ctx, ListFilter{Attributes: c.selector, Credentials: true})
	if err != nil {
		return nil, err
	}
	out := make([]pool.MemberStatus, 0, len(list))
	for _, p := range list {
		u, src, err := parseMemberURL(p.URL)
		if err != nil {
			return nil, fmt.Errorf("lease API: member %s: %w", p.Name, err)
		}
		if p.Name == "" {
			return nil, errors.New("lease API: a listed member has no name")
		}
		ms := pool.MemberStatus{
			Member:       pool.Member{Name: p.Name, URL: u, SourceAddr: src, Attributes: p.Attributes},
			Healthy:      p.Healthy,
			Latency:      time.Duration(p.LatencyMillis) * time.Millisecond,
			ActiveLeases: p.ActiveLeases,
		}
		for _, cd := range p.Cooldowns {
			if ms.Cooldowns == nil {
				ms.Cooldowns = make(map[string]time.Time, len(p.Cooldowns))
			}
			ms.Cooldowns[cd.Target] = cd.Until
		}
		out = append(out, ms)
	}
	return out, nil
}

// IsOutage reports whether err says the lease API could not serve at all —
// no answer, or any 5xx (store_unavailable, internal, a proxy's 502/503/504)
// — as opposed to an answer about the request (409 no_match, 400, 401). A
// gateway with a last-known pool serves from it on an outage, never on a
// refusal.
func IsOutage(err error) bool {
	if errors.Is(err, pool.ErrUnreachable) {
		return true
	}
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.Status >= 500
}

// do sends one request and reads the whole answer, so the connection goes
// back to the pool. A failure on the connection level (no answer at all) is
// retried once, on the next URL when there are several — every lease call
// is safe to repeat: release is idempotent, a repeated report adds no
// strike, an acquire carries its idempotency key. Transport failures wrap
// ErrUnreachable (and the ctx error, when that was the cause).
func (c *Client) do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var buf []byte
	if body != nil {
		var err error
		if buf, err = json.Marshal(body); err != nil {
			return 0, nil, fmt.Errorf("lease API: encoding the request: %w", err)
		}
	}
	i := int(c.next.Load()) % len(c.bases)
	status, raw, err := c.doOnce(ctx, c.bases[i], method, path, body != nil, buf)
	if err == nil || ctx.Err() != nil || !errors.Is(err, pool.ErrUnreachable) {
		return status, raw, err
	}
	// Move every later call on too: the replica is likely gone.
	next := (i + 1) % len(c.bases)
	c.next.CompareAndSwap(uint32(i), uint32(next))
	return c.doOnce(ctx, c.bases[next], method, path, body != nil, buf)
}

func (c *Client) doOnce(ctx context.Context, base, method, path string, hasBody bool, buf []byte) (int, []byte, error) {
	var rd io.Reader
	if hasBody {
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return 0, nil, fmt.Errorf("lease API: building the request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	if c.tokens != nil {
		tok, err := c.tokens.get()
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if p := c.lean[base]; p != nil {
		// The lean path writes on a kept connection without looking at
		// ctx first: a call whose caller already gave up would still take
		// a lease nobody holds. (net/http's Transport checks it itself.)
		if err := ctx.Err(); err != nil {
			return 0, nil, fmt.Errorf("%w: %s %s: %w", pool.ErrUnreachable, method, base, err)
		}
		status, raw, err := leanDo(ctx, p, req)
		if err != nil {
			return 0, nil, fmt.Errorf("%w: %s %s: %w", pool.ErrUnreachable, method, base, err)
		}
		return status, raw, nil
	}
	resp, err := c.httpc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %s %s: %w", pool.ErrUnreachable, method, base, unwrapURLError(err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxClientResponseBytes))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: reading the answer to %s %s: %w", pool.ErrUnreachable, method, base, err)
	}
	return resp.StatusCode, raw, nil
}

// unwrapURLError drops *url.Error's wrapping, whose message repeats the full
// URL; the caller names method and base itself.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func apiError(status int, raw []byte) *APIError {
	var body apiErrorBody
	if err := json.Unmarshal(raw, &body); err == nil && body.Error != "" {
		return &APIError{Status: status, Code: body.Error, Message: body.Message}
	}
	msg := strings.TrimSpace(string(raw))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	return &APIError{Status: status, Message: msg}
}

// tokenFile is a bearer token kept in a file that is replaced in place (a
// projected service-account token): read at most every TokenFileRefresh,
// the last good value kept when a read fails.
type tokenFile struct {
	path  string
	every time.Duration
	mu    sync.Mutex
	tok   string
	at    time.Time
}

// get returns the current token, re-reading the file when it is due.
func (t *tokenFile) get() (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tok != "" && time.Since(t.at) < t.every {
		return t.tok, nil
	}
	tok, err := t.readLocked()
	if err != nil {
		if t.tok != "" {
			return t.tok, nil
		}
		return "", err
	}
	return tok, nil
}

// read forces a read now.
func (t *tokenFile) read() (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.readLocked()
}

func (t *tokenFile) readLocked() (string, error) {
	raw, err := os.ReadFile(t.path)
	if err != nil {
		return "", fmt.Errorf("lease API token file: %w", err)
	}
	tok := strings.TrimSpace(string(raw))
	if tok == "" {
		return "", fmt.Errorf("lease API token file %s is empty", t.path)
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("lease API token file %s holds more than one line", t.path)
	}
	t.tok, t.at = tok, time.Now()
	return tok, nil
}
