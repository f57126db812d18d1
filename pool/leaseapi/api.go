// Package leaseapi is the lease HTTP API over a pool.APIBackend: the server
// (NewAPIServer) that the controller and a gateway with --lease-api-listen
// run, and the client (Client) that a gateway in --lease-api mode and
// proxyfleet lease use. It is apart from pool so that the store and its
// contract do not depend on HTTP, and the import graph shows who speaks the
// wire format: controller/leases, gateway, cmd/proxyfleet.
package leaseapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// MaxAPIBodyBytes caps every lease API request body at 64 KiB (no lease
// request needs more; a bigger body is a client bug or an attack); a
// larger body is a 413 and changes nothing.
const MaxAPIBodyBytes = 64 << 10

// Outcomes passed to LeaseRecorder.LeaseRequest, one per POST /v1/leases.
const (
	// LeaseOutcomeGranted is a 201: a lease was handed out.
	LeaseOutcomeGranted = "granted"
	// LeaseOutcomeNoMatch is a 409: no member was usable.
	LeaseOutcomeNoMatch = "no_match"
	// LeaseOutcomeInvalid is a 4xx for a malformed request (bad JSON, bad TTL, oversized body).
	LeaseOutcomeInvalid = "invalid"
	// LeaseOutcomeError is a 5xx: the backend failed in an unexpected way.
	LeaseOutcomeError = "error"
	// LeaseOutcomeNotShared is a 403 not_shared: the caller asked for
	// members its identity may not lease (tenancy, docs/tenancy.md).
	LeaseOutcomeNotShared = "not_shared"
)

// Error codes of the lease API: the "error" field of every error body.
const (
	apiErrBadRequest    = "bad_request"
	apiErrInvalidTTL    = "invalid_ttl"
	apiErrTTLTooLong    = "ttl_too_long"
	apiErrInvalidResult = "invalid_result"
	apiErrNoMatch       = "no_match"
	apiErrUnknownLease  = "unknown_lease"
	apiErrUnauthorized  = "unauthorized"
	apiErrForbidden     = "forbidden"
	apiErrNotShared     = "not_shared"
	apiErrAuthDown      = "auth_unavailable"
	apiErrTooLarge      = "body_too_large"
	apiErrNotFound      = "not_found"
	apiErrMethod        = "method_not_allowed"
	apiErrInternal      = "internal"
	apiErrUnavailable   = "store_unavailable"
	apiErrMediaType     = "unsupported_media_type"
	apiErrBrowser       = "browser_request"
	apiErrHost          = "host_not_allowed"
)

// LeaseRecorder counts lease requests by outcome (a Prometheus counter in
// cmd/proxyfleet); leaseapi does not import the metrics package.
type LeaseRecorder interface {
	LeaseRequest(outcome string)
}

// APIOptions configures NewAPIServer.
type APIOptions struct {
	// Token is the bearer token clients must send. Empty turns authentication
	// off; the caller should log a loud warning when it does that.
	Token string
	// Logger receives request logs (Debug) and failures (Error); nil discards.
	Logger *slog.Logger
	// Recorder, when set, counts POST /v1/leases by outcome.
	Recorder LeaseRecorder
	// Reviewer, when set, vouches for bearer tokens other than Token (the
	// controller's TokenReview + SubjectAccessReview of a pod's projected
	// service-account token), so crawler namespaces need no shared secret.
	// Setting it turns authentication on even without a Token.
	Reviewer TokenReviewer
	// Pacer serves POST /v1/pace and GET /v1/pace/slowed: the pace of
	// sites its callers share. Nil is the backend's when it is a
	// pool.SitePacer; without one those routes answer 404.
	Pacer pool.SitePacer
	// Tiers serves POST /v1/tier: each site's place on the tiers its
	// callers share (docs/tiers.md). Nil is the backend's when it is a
	// pool.SiteTierKeeper; without one the route answers 404.
	Tiers pool.SiteTierKeeper
	// Quotas serves POST /v1/quota: the quotas of token clients that
	// --lease-api gateways keep together. Nil is the backend's when it is
	// a pool.QuotaKeeper; without one the route answers 404.
	Quotas pool.QuotaKeeper
}

// TokenReviewer decides on a bearer token the static Token did not match.
// It returns the caller it vouches for (put in the request's context,
// pool.WithClient, for the backend to decide what it may lease) and a nil
// error to let the request through, an error wrapping
// ErrTokenInvalid for a 401, one wrapping ErrTokenForbidden for a 403, and
// anything else for a 503 (the reviewer could not decide; the caller retries).
// Its error messages are shown to the caller and must not contain the token.
type TokenReviewer interface {
	ReviewToken(ctx context.Context, token string) (pool.Client, error)
}

var (
	// ErrTokenInvalid is a token nobody vouches for: a 401.
	ErrTokenInvalid = errors.New("invalid bearer token")
	// ErrTokenForbidden is a valid identity without the right to lease: a 403.
	ErrTokenForbidden = errors.New("not allowed to lease")
)

// ProxyInfo is one member in GET /v1/proxies. URL is redacted (no password):
// the list is for discovery, credentials come only with a lease, or with
// credentials=true (ListFilter.Credentials), which a --lease-api gateway
// asks for to keep a last-known pool it can lease from itself while the
// API is away. That reveals nothing a caller could not already get: the
// same token may lease any member by name (a lease's proxy pin), and a
// lease answer carries the member's credentials.
type ProxyInfo struct {
	// Name is the member's unique name (what a lease's "proxy" pins).
	Name string `json:"name"`
	// URL is the member's address with the password masked; direct://[addr] for direct egress.
	URL string `json:"url"`
	// Attributes are what selectors and attr.k=v filters match.
	Attributes map[string]string `json:"attributes"`
	// Healthy is the probe verdict; only healthy members are leased.
	Healthy bool `json:"healthy"`
	// LatencyMillis is the last successful probe's round trip; 0 is unknown.
	LatencyMillis int64 `json:"latencyMillis"`
	// ActiveLeases counts unexpired, unreleased leases on the member.
	ActiveLeases int `json:"activeLeases"`
	// Cooldowns are the running cooldowns, sorted by target.
	Cooldowns []CooldownInfo `json:"cooldowns"`
}

// CooldownInfo is one {member, target} cooldown in a ProxyInfo. Target ""
// means every target (an upstream failure or a report without any target).
type CooldownInfo struct {
	// Target is the site key the member rests for; "" is every target.
	Target string `json:"target"`
	// Until is when the cooldown ends.
	Until time.Time `json:"until"`
}

// ListFilter narrows GET /v1/proxies: attribute equality (attr.k=v) and,
// with HealthyOnly, only members whose probes pass (healthy=true).
type ListFilter struct {
	// Attributes must all match (attr.k=v).
	Attributes map[string]string
	// HealthyOnly drops members whose probes fail (healthy=true).
	HealthyOnly bool
	// Credentials asks for the members' URLs with their credentials, as a
	// lease answer carries them (credentials=true).
	Credentials bool
}

// LeaseInfo is the wire form of a granted lease (the 201 body of
// POST /v1/leases). Proxy.URL carries the upstream's credentials so the
// holder can use it; the API is authenticated for that reason.
type LeaseInfo struct {
	// LeaseID is what release and report take.
	LeaseID string `json:"leaseID"`
	// Proxy is the leased member, credentials included.
	Proxy LeaseProxy `json:"proxy"`
	// Target is the normalised site key the lease is for ("" for none).
	Target string `json:"target"`
	// ExpiresAt is when the lease ends unless released earlier.
	ExpiresAt time.Time `json:"expiresAt"`
	// TTLSeconds is the granted lifetime.
	TTLSeconds int64 `json:"ttlSeconds"`
	// FailureRest is true when the member rests for its own failures and
	// was leased anyway, because no other member could serve the request
	// (pool.Lease.FailureRest); report ok or answered once it answers.
	FailureRest bool `json:"failureRest,omitempty"`
}

// LeaseProxy is the member inside a LeaseInfo. A direct member's URL is
// "direct://" or "direct://<source address>".
type LeaseProxy struct {
	// Name is the member's unique name.
	Name string `json:"name"`
	// URL is the upstream with its credentials.
	URL string `json:"url"`
	// Attributes are the member's attributes.
	Attributes map[string]string `json:"attributes"`
}

// NewLeaseInfo renders a lease in its wire form, credentials included.
func NewLeaseInfo(l pool.Lease) LeaseInfo {
	return LeaseInfo{
		LeaseID: l.ID,
		Proxy: LeaseProxy{
			Name:       l.Member.Name,
			URL:        memberURL(l.Member),
			Attributes: nonNilAttrs(l.Member.Attributes),
		},
		Target:      l.Target,
		ExpiresAt:   l.ExpiresAt.UTC(),
		TTLSeconds:  ceilSeconds(l.TTL),
		FailureRest: l.FailureRest,
	}
}

// leaseRequest is the body of POST /v1/leases.
type leaseRequest struct {
	Selector   map[string]string `json:"selector,omitempty"`
	TTLSeconds int64             `json:"ttlSeconds,omitempty"`
	Target     string            `json:"target,omitempty"`
	Proxy      string            `json:"proxy,omitempty"`
	// IdempotencyKey makes a retried acquire return the lease the first
	// attempt took (see AcquireRequest.IdempotencyKey).
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
}

// reportRequest is the body of POST /v1/leases/{id}/report.
type reportRequest struct {
	Result            string `json:"result"`
	Target            string `json:"target,omitempty"`
	RetryAfterSeconds int64  `json:"retryAfterSeconds,omitempty"`
}

// proxyList is the body of GET /v1/proxies.
type proxyList struct {
	Proxies []ProxyInfo `json:"proxies"`
	Count   int         `json:"count"`
}

// apiErrorBody is every error answer: a stable code and a sentence for humans.
type apiErrorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// noMatchBody is the 409 answer: the error body plus the additive counts.
type noMatchBody struct {
	apiErrorBody
	pool.NoMatchError
}

type apiServer struct {
	backend   pool.APIBackend
	tokenHash [sha256.Size]byte
	authOn    bool
	reviewer  TokenReviewer
	log       *slog.Logger
	recorder  LeaseRecorder
	pacer     pool.SitePacer
	tiers     pool.SiteTierKeeper
	quotas    pool.QuotaKeeper
}

// NewAPIServer returns the lease API (docs/api.md) as an http.Handler:
// recover → request log → no browsers (and, without auth, no Host but
// localhost or an IP address) → 64 KiB body limit → bearer auth (/healthz
// exempt) → JSON bodies only → routes. The handler holds no state of its
// own; leases live in b.
func NewAPIServer(b pool.APIBackend, o APIOptions) http.Handler {
	s := &apiServer{backend: b, log: o.Logger, recorder: o.Recorder, reviewer: o.Reviewer, authOn: o.Reviewer != nil, pacer: o.Pacer}
	if s.pacer == nil {
		s.pacer, _ = b.(pool.SitePacer)
	}
	if s.tiers = o.Tiers; s.tiers == nil {
		s.tiers, _ = b.(pool.SiteTierKeeper)
	}
	if s.quotas = o.Quotas; s.quotas == nil {
		s.quotas, _ = b.(pool.QuotaKeeper)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if o.Token != "" {
		s.authOn = true
		s.tokenHash = sha256.Sum256([]byte(o.Token))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /v1/proxies", s.listProxies)
	mux.HandleFunc("POST /v1/leases", s.acquire)
	mux.HandleFunc("DELETE /v1/leases/{id}", s.release)
	mux.HandleFunc("POST /v1/leases/{id}/report", s.report)
	mux.HandleFunc("POST /v1/pace", s.pace)
	mux.HandleFunc("GET /v1/pace/slowed", s.slowedSites)
	mux.HandleFunc("POST /v1/tier", s.tier)
	mux.HandleFunc("POST /v1/quota", s.quota)
	// Method-less patterns are less specific than the ones above, so they
	// only catch the wrong methods: a JSON 405 instead of the mux's text one.
	mux.Handle("/healthz", methodNotAllowed("GET, HEAD"))
	mux.Handle("/v1/proxies", methodNotAllowed("GET, HEAD"))
	mux.Handle("/v1/leases", methodNotAllowed("POST"))
	mux.Handle("/v1/leases/{id}", methodNotAllowed("DELETE"))
	mux.Handle("/v1/leases/{id}/report", methodNotAllowed("POST"))
	mux.Handle("/v1/pace", methodNotAllowed("POST"))
	mux.Handle("/v1/pace/slowed", methodNotAllowed("GET, HEAD"))
	mux.Handle("/v1/tier", methodNotAllowed("POST"))
	mux.Handle("/v1/quota", methodNotAllowed("POST"))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		refuse(w, r, http.StatusNotFound, apiErrNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	return s.recoverer(s.requestLog(s.noBrowsers(limitBody(s.authenticate(requireJSON(mux))))))
}

func methodNotAllowed(allow string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		refuse(w, r, http.StatusMethodNotAllowed, apiErrMethod,
			fmt.Sprintf("method %s not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow))
	})
}

func (s *apiServer) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler { //nolint:errorlint // sentinel compared by identity, as net/http does
				panic(v)
			}
			s.log.Error("lease API handler panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v))
			writeError(w, http.StatusInternalServerError, apiErrInternal, "internal error")
		}()
		next.ServeHTTP(w, r)
	})
}

// statusWriter remembers the status code for the request log.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection (refuse sets
// its read deadline).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// requestLog logs each request at Debug; it costs nothing when Debug is off.
func (s *apiServer) requestLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.log.Enabled(r.Context(), slog.LevelDebug) {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		s.log.DebugContext(r.Context(), "lease API request", "method", r.Method, "path", r.URL.Path,
			"status", sw.status, "duration", time.Since(start), "remote", r.RemoteAddr)
	})
}

func limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > MaxAPIBodyBytes {
			refuse(w, r, http.StatusRequestEntityTooLarge, apiErrTooLarge,
				fmt.Sprintf("request body of %d bytes is above the limit of %d bytes", r.ContentLength, MaxAPIBodyBytes))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxAPIBodyBytes)
		next.ServeHTTP(w, r)
	})
}

// noBrowsers refuses what a web page in a browser could send, so that a
// page the API's user opens cannot use it (docs/api.md, "Browsers"):
//
//   - a request with an Origin header, or Sec-Fetch-Site cross-site or
//     same-site: browsers send them, programs do not, and a POST a page
//     sends needs no CORS preflight when its Content-Type is text/plain,
//     so it would reach the handlers (report bans, take the pace's places);
//   - without authentication, a Host that is neither localhost nor an IP
//     address: a DNS rebinding page (its own name resolving to 127.0.0.1)
//     is same-origin with the API and could read lease answers, which
//     carry members' passwords. An IP literal cannot be rebound (the
//     page's origin would be that very address, which serves no pages), so
//     an open API on a non-loopback address, reached by its IP, still
//     answers. With a token a rebinding page has nothing to send.
func (s *apiServer) noBrowsers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o, site := r.Header.Get("Origin"), r.Header.Get("Sec-Fetch-Site"); o != "" || site == "cross-site" || site == "same-site" {
			refuse(w, r, http.StatusForbidden, apiErrBrowser,
				"requests from web pages are refused (the request carries Origin or Sec-Fetch-Site): the lease API is for programs")
			return
		}
		if !s.authOn && !localOrIPHost(r.Host) {
			refuse(w, r, http.StatusForbidden, apiErrHost,
				fmt.Sprintf("Host %q refused: an API without a token answers only requests addressed to localhost or an IP address (a guard against DNS rebinding); use http://127.0.0.1:<port>, or give the API a token", r.Host))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// localOrIPHost reports whether a Host header (with or without a port) is
// localhost or an IP literal.
func localOrIPHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	_, err := netip.ParseAddr(host)
	return err == nil
}

// requireJSON refuses a request body that is not application/json (any
// parameters, such as charset, allowed) with a 415. A browser sends a
// text/plain or form body cross-origin without asking first (no CORS
// preflight); application/json it may not, so this also keeps pages out
// where an old browser sends no Origin.
func requireJSON(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 { // -1: chunked, a body of unknown length
			ct := r.Header.Get("Content-Type")
			if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
				refuse(w, r, http.StatusUnsupportedMediaType, apiErrMediaType,
					fmt.Sprintf("Content-Type %q: request bodies must be sent as application/json", ct))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (s *apiServer) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authOn || r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			unauthorized(w, r, "missing bearer token: send Authorization: Bearer <token>")
			return
		}
		// Hashing first makes the comparison constant-time in the token's length too.
		token = strings.TrimSpace(token)
		got := sha256.Sum256([]byte(token))
		if s.tokenHash != ([sha256.Size]byte{}) && subtle.ConstantTimeCompare(got[:], s.tokenHash[:]) == 1 {
			next.ServeHTTP(w, r)
			return
		}
		if s.reviewer == nil {
			unauthorized(w, r, "invalid bearer token")
			return
		}
		switch c, err := s.reviewer.ReviewToken(r.Context(), token); {
		case err == nil:
			next.ServeHTTP(w, r.WithContext(pool.WithClient(r.Context(), c)))
		case errors.Is(err, ErrTokenInvalid):
			unauthorized(w, r, err.Error())
		case errors.Is(err, ErrTokenForbidden):
			refuse(w, r, http.StatusForbidden, apiErrForbidden, err.Error())
		default:
			s.log.Error("lease API: token review failed", "err", err)
			refuse(w, r, http.StatusServiceUnavailable, apiErrAuthDown, "cannot verify the token now: "+err.Error())
		}
	})
}

func unauthorized(w http.ResponseWriter, r *http.Request, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="proxyfleet"`)
	refuse(w, r, http.StatusUnauthorized, apiErrUnauthorized, msg)
}

func (s *apiServer) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok")
}

func (s *apiServer) listProxies(w http.ResponseWriter, r *http.Request) {
	attrs := map[string]string{}
	healthy := "" // "", "true" or "false"
	withCredentials := false
	for key, vals := range r.URL.Query() {
		if len(vals) != 1 {
			writeError(w, http.StatusBadRequest, apiErrBadRequest, fmt.Sprintf("query parameter %q given %d times; give it once", key, len(vals)))
			return
		}
		switch {
		case key == "healthy":
			b, err := strconv.ParseBool(vals[0])
			if err != nil {
				writeError(w, http.StatusBadRequest, apiErrBadRequest, fmt.Sprintf("healthy=%q: want true or false", vals[0]))
				return
			}
			healthy = strconv.FormatBool(b)
		case key == "credentials":
			b, err := strconv.ParseBool(vals[0])
			if err != nil {
				writeError(w, http.StatusBadRequest, apiErrBadRequest, fmt.Sprintf("credentials=%q: want true or false", vals[0]))
				return
			}
			withCredentials = b
		case strings.HasPrefix(key, "attr."):
			name := strings.TrimPrefix(key, "attr.")
			if name == "" {
				writeError(w, http.StatusBadRequest, apiErrBadRequest, "attribute filter with an empty name: want attr.<name>=<value>")
				return
			}
			attrs[name] = vals[0]
		default:
			writeError(w, http.StatusBadRequest, apiErrBadRequest,
				fmt.Sprintf("unknown query parameter %q: want attr.<name>=<value>, healthy=true|false or credentials=true|false", key))
			return
		}
	}
	members, err := s.backend.ListMembers(r.Context())
	if err != nil {
		s.backendFailed(w, "listing members", err)
		return
	}
	out := proxyList{Proxies: make([]ProxyInfo, 0, len(members))}
	for _, m := range members {
		if healthy != "" && strconv.FormatBool(m.Healthy) != healthy {
			continue
		}
		if !pool.MatchSelector(m.Attributes, attrs) {
			continue
		}
		p := proxyInfo(m)
		if withCredentials {
			p.URL = memberURL(m.Member)
		}
		out.Proxies = append(out.Proxies, p)
	}
	sort.Slice(out.Proxies, func(i, j int) bool { return out.Proxies[i].Name < out.Proxies[j].Name })
	out.Count = len(out.Proxies)
	if withCredentials {
		w.Header().Set("Cache-Control", "no-store") // as a lease answer: the body carries upstream credentials
	}
	writeJSON(w, http.StatusOK, out)
}

func proxyInfo(m pool.MemberStatus) ProxyInfo {
	p := ProxyInfo{
		Name:          m.Name,
		URL:           m.Redacted(),
		Attributes:    nonNilAttrs(m.Attributes),
		Healthy:       m.Healthy,
		LatencyMillis: m.Latency.Milliseconds(),
		ActiveLeases:  m.ActiveLeases,
		Cooldowns:     make([]CooldownInfo, 0, len(m.Cooldowns)),
	}
	for target, until := range m.Cooldowns {
		p.Cooldowns = append(p.Cooldowns, CooldownInfo{Target: target, Until: until.UTC()})
	}
	sort.Slice(p.Cooldowns, func(i, j int) bool { return p.Cooldowns[i].Target < p.Cooldowns[j].Target })
	return p
}

func (s *apiServer) acquire(w http.ResponseWriter, r *http.Request) {
	var body leaseRequest
	if !s.decodeBody(w, r, &body, true) {
		s.record(LeaseOutcomeInvalid)
		return
	}
	req, ok := s.acquireRequest(w, body)
	if !ok {
		s.record(LeaseOutcomeInvalid)
		return
	}
	lease, err := s.backend.Acquire(r.Context(), req)
	if err != nil {
		var nm *pool.NoMatchError
		switch {
		case errors.As(err, &nm):
			s.record(LeaseOutcomeNoMatch)
			if nm.RetryAfterSeconds > 0 {
				w.Header().Set("Retry-After", strconv.FormatInt(nm.RetryAfterSeconds, 10))
			}
			writeJSON(w, http.StatusConflict, noMatchBody{
				apiErrorBody: apiErrorBody{Error: apiErrNoMatch, Message: nm.Error()},
				NoMatchError: *nm,
			})
		case errors.Is(err, pool.ErrTTLTooLong):
			s.record(LeaseOutcomeInvalid)
			writeError(w, http.StatusBadRequest, apiErrTTLTooLong, err.Error())
		case errors.Is(err, pool.ErrInvalidTTL):
			s.record(LeaseOutcomeInvalid)
			writeError(w, http.StatusBadRequest, apiErrInvalidTTL, err.Error())
		case errors.Is(err, pool.ErrForbidden):
			// The backend refused this caller what it asked for (members
			// of a namespace that did not share them): a 403 that names
			// them, never a 409 that would read as an empty pool.
			s.record(LeaseOutcomeNotShared)
			writeError(w, http.StatusForbidden, apiErrNotShared, err.Error())
		default:
			s.record(LeaseOutcomeError)
			s.backendFailed(w, "lease acquire", err)
		}
		return
	}
	s.record(LeaseOutcomeGranted)
	w.Header().Set("Cache-Control", "no-store") // the body carries upstream credentials
	writeJSON(w, http.StatusCreated, NewLeaseInfo(lease))
}

// acquireRequest validates a lease request; on failure it has written the 400.
func (s *apiServer) acquireRequest(w http.ResponseWriter, body leaseRequest) (pool.AcquireRequest, bool) {
	for k := range body.Selector {
		if k == "" {
			writeError(w, http.StatusBadRequest, apiErrBadRequest, "selector has an empty attribute name")
			return pool.AcquireRequest{}, false
		}
	}
	if body.TTLSeconds < 0 {
		writeError(w, http.StatusBadRequest, apiErrInvalidTTL,
			fmt.Sprintf("ttlSeconds %d is negative; give a positive number of seconds, or 0 for the default", body.TTLSeconds))
		return pool.AcquireRequest{}, false
	}
	if limit := s.backend.MaxTTL(); limit > 0 && body.TTLSeconds > ceilSeconds(limit) {
		writeError(w, http.StatusBadRequest, apiErrTTLTooLong,
			fmt.Sprintf("ttlSeconds %d is above the maximum of %d seconds (%s)", body.TTLSeconds, ceilSeconds(limit), limit))
		return pool.AcquireRequest{}, false
	}
	if body.TTLSeconds > int64(maxDurationSeconds) {
		writeError(w, http.StatusBadRequest, apiErrTTLTooLong, fmt.Sprintf("ttlSeconds %d is out of range", body.TTLSeconds))
		return pool.AcquireRequest{}, false
	}
	if len(body.IdempotencyKey) > 128 {
		writeError(w, http.StatusBadRequest, apiErrBadRequest, fmt.Sprintf("idempotencyKey of %d bytes is above the limit of 128", len(body.IdempotencyKey)))
		return pool.AcquireRequest{}, false
	}
	req := pool.AcquireRequest{
		Selector:       body.Selector,
		Proxy:          body.Proxy,
		TTL:            time.Duration(body.TTLSeconds) * time.Second,
		IdempotencyKey: body.IdempotencyKey,
	}
	if body.Target != "" {
		t, err := rotation.ParseTarget(body.Target)
		if err != nil {
			writeError(w, http.StatusBadRequest, apiErrBadRequest, fmt.Sprintf("target %q %s", body.Target, err))
			return pool.AcquireRequest{}, false
		}
		req.Target = t
	}
	return req, true
}

// maxDurationSeconds is the largest whole-second count a time.Duration holds.
const maxDurationSeconds = int64(1<<63-1) / int64(time.Second)

func (s *apiServer) release(w http.ResponseWriter, r *http.Request) {
	if err := s.backend.Release(r.Context(), r.PathValue("id")); err != nil {
		// Release is idempotent by contract; an error here is the backend failing.
		s.backendFailed(w, "lease release", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *apiServer) report(w http.ResponseWriter, r *http.Request) {
	var body reportRequest
	if !s.decodeBody(w, r, &body, false) {
		return
	}
	result, err := rotation.ParseResult(body.Result)
	if err != nil {
		writeError(w, http.StatusBadRequest, apiErrInvalidResult, err.Error())
		return
	}
	if body.RetryAfterSeconds < 0 || body.RetryAfterSeconds > maxDurationSeconds {
		writeError(w, http.StatusBadRequest, apiErrBadRequest,
			fmt.Sprintf("retryAfterSeconds %d is out of range; give a number of seconds >= 0", body.RetryAfterSeconds))
		return
	}
	rep := pool.Report{Result: result, RetryAfter: time.Duration(body.RetryAfterSeconds) * time.Second}
	if body.Target != "" {
		t, err := rotation.ParseTarget(body.Target)
		if err != nil {
			writeError(w, http.StatusBadRequest, apiErrBadRequest, fmt.Sprintf("target %q %s", body.Target, err))
			return
		}
		rep.Target = t
	}
	switch err := s.backend.Report(r.Context(), r.PathValue("id"), rep); {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, pool.ErrUnknownLease):
		writeError(w, http.StatusNotFound, apiErrUnknownLease,
			fmt.Sprintf("lease %q is unknown or past its report window", r.PathValue("id")))
	case errors.Is(err, pool.ErrInvalidResult):
		writeError(w, http.StatusBadRequest, apiErrInvalidResult, err.Error())
	default:
		s.backendFailed(w, "lease report", err)
	}
}

// backendFailed answers a store failure: 503 store_unavailable (with
// Retry-After) when the shared store cannot be reached, which clients treat
// as transient, else a 500.
func (s *apiServer) backendFailed(w http.ResponseWriter, what string, err error) {
	if errors.Is(err, pool.ErrStoreUnavailable) {
		s.log.Warn(what+" failed: lease store unavailable", "error", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, apiErrUnavailable, what+" failed: "+err.Error())
		return
	}
	s.log.Error(what+" failed", "error", err)
	writeError(w, http.StatusInternalServerError, apiErrInternal, what+" failed: "+err.Error())
}

// decodeBody reads exactly one JSON object with no unknown fields. An empty
// body is accepted as {} when allowEmpty. On failure it has written the 4xx.
func (s *apiServer) decodeBody(w http.ResponseWriter, r *http.Request, v any, allowEmpty bool) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	// One JSON object and nothing else: a null, an array or a number
	// would decode into the zero request (a lease for anything) instead
	// of an error.
	var raw json.RawMessage
	err := dec.Decode(&raw)
	if errors.Is(err, io.EOF) {
		if allowEmpty {
			return true
		}
		writeError(w, http.StatusBadRequest, apiErrBadRequest, "request body is empty; want a JSON object")
		return false
	}
	if err == nil {
		if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
			writeError(w, http.StatusBadRequest, apiErrBadRequest, "request body is a JSON "+jsonKind(t)+"; want a JSON object")
			return false
		}
		one := json.NewDecoder(bytes.NewReader(raw))
		one.DisallowUnknownFields()
		err = one.Decode(v)
	}
	if err == nil {
		// Exactly one value: anything but whitespace after it is an error.
		var extra json.RawMessage
		if err2 := dec.Decode(&extra); !errors.Is(err2, io.EOF) {
			if err2 == nil {
				err = errors.New("trailing data after the JSON object")
			} else {
				err = err2
			}
		}
	}
	if err == nil {
		return true
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, apiErrTooLarge,
			fmt.Sprintf("request body is above the limit of %d bytes", tooBig.Limit))
		return false
	}
	writeError(w, http.StatusBadRequest, apiErrBadRequest, "invalid request body: "+describeJSONError(err))
	return false
}

// jsonKind names the JSON value that starts t.
func jsonKind(t []byte) string {
	switch {
	case len(t) == 0:
		return "nothing"
	case t[0] == 'n':
		return "null"
	case t[0] == '[':
		return "array"
	case t[0] == '"':
		return "string"
	case t[0] == 't' || t[0] == 'f':
		return "boolean"
	}
	return "number"
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field != "" {
			return fmt.Sprintf("field %q: want %s, got a JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
		}
		return fmt.Sprintf("want a JSON object, got a JSON %s", typeErr.Value)
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return fmt.Sprintf("malformed JSON at byte %d: %s", syntaxErr.Offset, strings.TrimPrefix(syntaxErr.Error(), "json: "))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "truncated JSON"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

func (s *apiServer) record(outcome string) {
	if s.recorder != nil {
		s.recorder.LeaseRequest(outcome)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	buf, err := json.Marshal(v)
	if err != nil {
		// Only our own types are encoded here; this cannot happen with them.
		status = http.StatusInternalServerError
		buf, _ = json.Marshal(apiErrorBody{Error: apiErrInternal, Message: "encoding the answer failed"})
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(buf)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(buf, '\n'))
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, apiErrorBody{Error: code, Message: msg})
}

// refuse answers an error before the request's body is read (a 401, a
// 404, a 405, a 413 announced by Content-Length), and when one was
// announced, closes the connection without waiting for the body. Left to
// itself net/http reads the rest of an unread body before it answers, or
// after, to keep the connection: a client that announced a body and sends
// it slowly, or never, would hold the connection until the server's read
// timeout instead of getting its refusal. So the answer goes out with
// Connection: close and the connection is taken from the server and
// closed by lingerClose.
func refuse(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	unread := r.ContentLength != 0 // -1: chunked, length unknown
	if unread {
		w.Header().Set("Connection", "close")
	}
	writeError(w, status, code, msg)
	if !unread {
		return
	}
	rc := http.NewResponseController(w)
	if rc.Flush() == nil {
		if conn, _, err := rc.Hijack(); err == nil {
			go lingerClose(conn)
			return
		}
	}
	// No connection to take (HTTP/2, a test recorder): make the server
	// give up the rest of the body at once.
	_ = rc.SetReadDeadline(time.Now())
}

// refuseLinger is how long a refused connection is drained before it is
// closed: long enough for an honest client that is still sending its body
// (a 70 KiB one on a near network) to finish and read the answer, short
// enough that a client sending nothing holds nothing for long.
const refuseLinger = time.Second

// lingerClose closes a connection whose answer is sent while its client
// may still be sending: it stops writing (FIN), reads and drops what
// arrives for up to refuseLinger, then closes. Closing at once with
// unread bytes makes the kernel reset the connection, and the client
// would see the reset (a broken pipe) instead of the answer, as
// net/http's own closeWriteAndWait avoids.
func lingerClose(c net.Conn) {
	defer c.Close()
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(refuseLinger))
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 4*MaxAPIBodyBytes))
}

// memberURL is the member's address with credentials (lease answers only).
func memberURL(m pool.Member) string {
	if m.URL == nil {
		return m.Redacted() // direct://[addr]: there is no secret in it
	}
	return m.URL.String()
}

// parseMemberURL is memberURL's inverse, for the client.
func parseMemberURL(raw string) (*url.URL, netip.Addr, error) {
	if rest, ok := strings.CutPrefix(raw, "direct://"); ok {
		if rest == "" {
			return nil, netip.Addr{}, nil
		}
		addr, err := netip.ParseAddr(strings.Trim(rest, "[]"))
		if err != nil {
			return nil, netip.Addr{}, fmt.Errorf("direct member source address %q: %w", rest, err)
		}
		return nil, addr, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, netip.Addr{}, fmt.Errorf("member URL %q: %s", redact.URL(raw), redact.Reason(raw, err))
	}
	if u.Scheme == "" || u.Host == "" {
		return nil, netip.Addr{}, fmt.Errorf("member URL %q has no scheme or host", redact.Parsed(u))
	}
	return u, netip.Addr{}, nil
}

func nonNilAttrs(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// ceilSeconds is d in whole seconds, rounded up: the wire counts seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
