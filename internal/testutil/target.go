package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"
)

// SeenSourceHeader is the response header in which a Target echoes the source
// address it saw, so clients can tell which upstream carried a request
// without parsing the body.
const SeenSourceHeader = "X-Seen-Source"

// recentRequests bounds the request log a Target keeps (benchmarks send millions).
const recentRequests = 4096

// TargetOptions configures a Target.
type TargetOptions struct {
	// Host is the loopback IP to listen on (default 127.0.0.1). Distinct
	// hosts are distinct targets to the gateway, whose target key drops the
	// port. A test in its own network namespace (InNetNS) may name any
	// address of that namespace.
	Host string
	// Port is the port to listen on; 0 (the default) is a free one the
	// kernel picks. Only in a test's own network namespace, on an address
	// the test added there (AddNetNSAddr), is a fixed port certainly free:
	// an HTTPS site on 443, the only port a generated Squid CONNECTs to.
	Port int
	// Pages are HTML documents served at exact paths (for browsers); every
	// other path gets the JSON TargetAnswer. Requests for pages are recorded
	// like any other.
	Pages map[string]string
}

// TargetAnswer is the JSON body a Target answers with.
type TargetAnswer struct {
	// Source is the address the request came from: the upstream's tcp_outgoing_address.
	Source string `json:"source"`
	Host   string `json:"host"`
	Method string `json:"method"`
	Path   string `json:"path"`
	Status int    `json:"status"`
}

// SeenRequest is one request as the Target received it.
type SeenRequest struct {
	Source string
	Method string
	Host   string
	URI    string
	Header http.Header
	Status int
	Time   time.Time
}

type targetRule struct {
	status  int
	headers map[string]string
	body    *string // replaces the answer's body when set
	times   int     // path rules: how many more requests it answers (<0: every one)
}

// ClientHello is what a TLS Target saw of one client's handshake: the
// fields a site fingerprints a client by (JA3/JA4 read these).
type ClientHello struct {
	Source            string
	ServerName        string
	CipherSuites      []uint16
	Extensions        []uint16
	SupportedCurves   []tls.CurveID
	SupportedVersions []uint16
	SignatureSchemes  []tls.SignatureScheme
	ALPN              []string
}

// Target is a Go HTTP(S) server on a loopback address that answers with the
// source address it sees, records what it received, and can be told to
// answer one source address differently (429 + Retry-After to one upstream).
type Target struct {
	host     string
	port     int
	scheme   string
	srv      *http.Server
	certPool *x509.CertPool
	certPEM  []byte
	pages    map[string]string

	mu        sync.Mutex
	rules     map[string]targetRule
	pathRules map[string]*targetRule
	hellos    []ClientHello
	counts    map[string]int
	recent    []SeenRequest // ring of the last recentRequests
	next      int
	total     int
}

// StartTarget starts a plain-HTTP Target, closed at test cleanup.
func StartTarget(t testing.TB, opts TargetOptions) *Target {
	t.Helper()
	tg, err := LaunchTarget(opts, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tg.Close)
	return tg
}

// StartTLSTarget starts an HTTPS Target with a fresh self-signed certificate
// for its IP; CertPool and ClientTLSConfig verify it.
func StartTLSTarget(t testing.TB, opts TargetOptions) *Target {
	t.Helper()
	tg, err := LaunchTarget(opts, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tg.Close)
	return tg
}

// LaunchTarget starts a Target outside a test (e2e/bench); the caller must Close it.
func LaunchTarget(opts TargetOptions, useTLS bool) (*Target, error) {
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	ip := net.ParseIP(opts.Host)
	if ip == nil || (!ip.IsLoopback() && os.Getenv(netnsEnv) == "") {
		return nil, fmt.Errorf("target host %q must be a loopback IP (any address only in a test's own network namespace, InNetNS)", opts.Host)
	}
	if opts.Port != 0 && os.Getenv(netnsEnv) == "" {
		return nil, fmt.Errorf("target port %d: a fixed port only in a test's own network namespace (InNetNS); give 0 for a free one", opts.Port)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)))
	if err != nil {
		return nil, err
	}
	tg := &Target{
		host:      opts.Host,
		port:      ln.Addr().(*net.TCPAddr).Port,
		scheme:    "http",
		rules:     map[string]targetRule{},
		pathRules: map[string]*targetRule{},
		counts:    map[string]int{},
		recent:    make([]SeenRequest, 0, 64),
		pages:     opts.Pages,
	}
	tg.srv = &http.Server{Handler: tg, ReadHeaderTimeout: 10 * time.Second}
	if useTLS {
		cert, pool, err := SelfSignedCert(ip)
		if err != nil {
			ln.Close()
			return nil, err
		}
		tg.scheme = "https"
		tg.certPool = pool
		tg.certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
		base := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		ln = tls.NewListener(ln, &tls.Config{
			MinVersion: tls.VersionTLS12,
			// Records every ClientHello, then serves with the base config.
			GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
				tg.recordHello(h)
				return base, nil
			},
		})
	}
	go func() { _ = tg.srv.Serve(ln) }()
	return tg, nil
}

// SelfSignedCert makes an ECDSA certificate valid for ip, and a pool
// trusting it: a Target's, and any other TLS server a test runs on ip.
func SelfSignedCert(ip net.IP) (tls.Certificate, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "testutil target " + ip.String()},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{ip},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool, nil
}

// ServeHTTP answers every path with a TargetAnswer, applying the rule for the
// request's source address when one is set.
func (tg *Target) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	source, _, _ := net.SplitHostPort(r.RemoteAddr)
	status := http.StatusOK
	tg.mu.Lock()
	rule, ok := tg.rules[source]
	if pr := tg.pathRules[r.URL.Path]; pr != nil && pr.times != 0 {
		rule, ok = *pr, true
		if pr.times > 0 {
			pr.times--
		}
	}
	if ok {
		status = rule.status
	}
	tg.counts[source]++
	tg.total++
	seen := SeenRequest{Source: source, Method: r.Method, Host: r.Host, URI: r.RequestURI, Header: r.Header.Clone(), Status: status, Time: time.Now()}
	if len(tg.recent) < recentRequests {
		tg.recent = append(tg.recent, seen)
	} else {
		tg.recent[tg.next] = seen
	}
	tg.next = (tg.next + 1) % recentRequests
	tg.mu.Unlock()

	if isWebSocketRequest(r) && status == http.StatusOK {
		tg.serveWebSocket(w, r)
		return
	}
	h := w.Header()
	h.Set(SeenSourceHeader, source)
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	for k, v := range rule.headers {
		h.Set(k, v)
	}
	if rule.body != nil {
		w.WriteHeader(status)
		_, _ = w.Write([]byte(*rule.body))
		return
	}
	if page, ok := tg.pages[r.URL.Path]; ok {
		h.Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(page))
		return
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(TargetAnswer{Source: source, Host: r.Host, Method: r.Method, Path: r.URL.Path, Status: status})
}

// SetRule makes the Target answer requests from source (an IP such as
// 127.0.0.3) with status and the given extra headers, until ClearRule.
func (tg *Target) SetRule(source string, status int, headers map[string]string) {
	cp := make(map[string]string, len(headers))
	for k, v := range headers {
		cp[k] = v
	}
	tg.mu.Lock()
	tg.rules[source] = targetRule{status: status, headers: cp}
	tg.mu.Unlock()
}

// SetRuleBody is SetRule with a body of its own instead of the JSON
// answer (a challenge page from the site to one upstream).
func (tg *Target) SetRuleBody(source string, status int, headers map[string]string, body string) {
	tg.SetRule(source, status, headers)
	tg.mu.Lock()
	r := tg.rules[source]
	r.body = &body
	tg.rules[source] = r
	tg.mu.Unlock()
}

// SetPathRule makes the next times requests to path, from any source,
// answer status with headers (times < 0: every request) and body (""
// keeps the JSON answer). It wins over a source's rule. A test that needs
// "the first attempt is refused, the retry is served" whichever upstream
// the pool picks first uses times=1.
func (tg *Target) SetPathRule(path string, times, status int, headers map[string]string, body string) {
	cp := make(map[string]string, len(headers))
	for k, v := range headers {
		cp[k] = v
	}
	r := &targetRule{status: status, headers: cp, times: times}
	if body != "" {
		r.body = &body
	}
	tg.mu.Lock()
	tg.pathRules[path] = r
	tg.mu.Unlock()
}

func (tg *Target) recordHello(h *tls.ClientHelloInfo) {
	source := ""
	if h.Conn != nil {
		source, _, _ = net.SplitHostPort(h.Conn.RemoteAddr().String())
	}
	ch := ClientHello{
		Source:            source,
		ServerName:        h.ServerName,
		CipherSuites:      append([]uint16(nil), h.CipherSuites...),
		Extensions:        append([]uint16(nil), h.Extensions...),
		SupportedCurves:   append([]tls.CurveID(nil), h.SupportedCurves...),
		SupportedVersions: append([]uint16(nil), h.SupportedVersions...),
		SignatureSchemes:  append([]tls.SignatureScheme(nil), h.SignatureSchemes...),
		ALPN:              append([]string(nil), h.SupportedProtos...),
	}
	tg.mu.Lock()
	if len(tg.hellos) < recentRequests {
		tg.hellos = append(tg.hellos, ch)
	}
	tg.mu.Unlock()
}

// ClientHellos are the TLS handshakes the Target received (the first
// 4096), oldest first; nil for a plain-HTTP Target.
func (tg *Target) ClientHellos() []ClientHello {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return append([]ClientHello(nil), tg.hellos...)
}

// ClearRule returns source to normal 200 answers.
func (tg *Target) ClearRule(source string) {
	tg.mu.Lock()
	delete(tg.rules, source)
	tg.mu.Unlock()
}

// Count is how many requests came from source.
func (tg *Target) Count(source string) int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.counts[source]
}

// Counts is a copy of the per-source request counts.
func (tg *Target) Counts() map[string]int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	cp := make(map[string]int, len(tg.counts))
	for k, v := range tg.counts {
		cp[k] = v
	}
	return cp
}

// Sources lists the source addresses seen so far, sorted.
func (tg *Target) Sources() []string {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	out := make([]string, 0, len(tg.counts))
	for k := range tg.counts {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Total is how many requests the Target answered.
func (tg *Target) Total() int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.total
}

// Requests returns the most recent requests (up to 4096), oldest first.
func (tg *Target) Requests() []SeenRequest {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	out := make([]SeenRequest, 0, len(tg.recent))
	if len(tg.recent) == recentRequests {
		out = append(out, tg.recent[tg.next:]...)
		out = append(out, tg.recent[:tg.next]...)
	} else {
		out = append(out, tg.recent...)
	}
	return out
}

// Reset forgets counts and recorded requests (rules stay).
func (tg *Target) Reset() {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	tg.counts = map[string]int{}
	tg.hellos = nil
	tg.recent = tg.recent[:0]
	tg.next = 0
	tg.total = 0
}

// Host is the IP the Target listens on.
func (tg *Target) Host() string { return tg.host }

// Port is the Target's TCP port.
func (tg *Target) Port() int { return tg.port }

// Addr is host:port.
func (tg *Target) Addr() string { return net.JoinHostPort(tg.host, strconv.Itoa(tg.port)) }

// URL is the base URL (http:// or https://host:port).
func (tg *Target) URL() string { return tg.scheme + "://" + tg.Addr() }

// CertPEM is the TLS Target's certificate in PEM (nil for plain HTTP): a
// CA file to hand a process (--upstream-ca-file).
func (tg *Target) CertPEM() []byte { return tg.certPEM }

// CertPool trusts the TLS Target's certificate (nil for plain HTTP).
func (tg *Target) CertPool() *x509.CertPool { return tg.certPool }

// ClientTLSConfig verifies the TLS Target's certificate (nil for plain HTTP).
func (tg *Target) ClientTLSConfig() *tls.Config {
	if tg.certPool == nil {
		return nil
	}
	return &tls.Config{RootCAs: tg.certPool, ServerName: tg.host, MinVersion: tls.VersionTLS12}
}

// Close stops the server and closes open connections.
func (tg *Target) Close() { _ = tg.srv.Close() }
