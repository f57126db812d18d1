// Package fpsite runs a TLS site of the test's own, a Site, that records
// what a fingerprinting CDN front sees of each connection: the raw
// ClientHello (parsed by internal/testutil/tlsfp), the ALPN chosen, the
// first HTTP/2 frames and every request. The MITM fingerprint tests point
// the gateway at it.
//
// It imports internal/testutil/tlsfp, and nothing else of ours: never
// the gateway or its mirror, whose ClientHello it must judge
// independently.
package fpsite

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/proxyfleet/proxyfleet/internal/testkit/sitecert"
	"github.com/proxyfleet/proxyfleet/internal/testutil/tlsfp"
)

// Site is a TLS site on a loopback address (answering a Git smart-HTTP
// ref advertisement of an empty repository, so git ls-remote succeeds,
// and a page or JSON otherwise) that records, per connection, the raw ClientHello (read off the socket before crypto/tls
// sees it), the protocol ALPN chose, the first HTTP/2 frames (SETTINGS,
// WINDOW_UPDATE, PRIORITY, the first HEADERS' pseudo-header order) and
// every request. It offers h2 and http/1.1, as a CDN front does.
type Site struct {
	ln      net.Listener
	cfg     *tls.Config
	certPEM []byte

	mu    sync.Mutex
	conns []*Conn
	rules map[string]*siteRule
	idle  time.Duration
	wg    sync.WaitGroup
}

type siteRule struct {
	times, status int
	header        map[string]string
}

// Conn is what a Site saw of one connection.
type Conn struct {
	Remote string
	// Hello is the ClientHello handshake message as sent; Print its fields.
	Hello []byte
	Print *tlsfp.HelloPrint
	// ALPN is the protocol negotiated ("" when none).
	ALPN string
	// Resumed reports a connection that resumed a TLS session; From is
	// then the index in Conns of the connection that session was issued
	// on (-1 when not resumed).
	Resumed bool
	From    int
	// H2 is the Akamai-style HTTP/2 fingerprint of the connection's first
	// frames, "SETTINGS|WINDOW_UPDATE|PRIORITY|pseudo-headers" ("" over
	// HTTP/1.1).
	H2       string
	mu       sync.Mutex
	Requests []Request
}

// Request is one request a Site answered.
type Request struct {
	Path, UserAgent, Proto string
	Status                 int
}

type siteConnKey struct{}

// Start starts a Site on host (a loopback IP),
// closed at test cleanup.
func Start(t testing.TB, host string) *Site {
	t.Helper()
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		t.Fatalf("fingerprint site host %q must be a loopback IP", host)
	}
	cert, caDER, err := sitecert.Issue("fpsite", ip, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Site{ln: ln, rules: map[string]*siteRule{},
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		cfg:     &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12}}
	// One ticket key for every connection, so a ticket one issued resumes
	// on another (per-connection configs would each make their own).
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		t.Fatal(err)
	}
	s.cfg.SetSessionTicketKeys([][32]byte{key})
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.Close)
	return s
}

func (s *Site) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(c)
		}()
	}
}

func (s *Site) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	read, msg, err := tlsfp.ReadClientHello(c)
	if err != nil {
		return
	}
	sc := &Conn{Remote: c.RemoteAddr().String(), Hello: msg, From: -1}
	if sc.Print, err = tlsfp.ParseClientHello(msg); err != nil {
		return
	}
	s.mu.Lock()
	s.conns = append(s.conns, sc)
	idx := len(s.conns) - 1
	s.mu.Unlock()
	// Each ticket names the connection it was issued on.
	cfg := s.cfg.Clone()
	from := -1
	cfg.WrapSession = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
		ss.Extra = append(ss.Extra, []byte(strconv.Itoa(idx)))
		return s.cfg.EncryptTicket(cs, ss)
	}
	cfg.UnwrapSession = func(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
		ss, err := s.cfg.DecryptTicket(identity, cs)
		if ss != nil && len(ss.Extra) > 0 {
			if n, err := strconv.Atoi(string(ss.Extra[len(ss.Extra)-1])); err == nil {
				from = n
			}
		}
		return ss, err
	}
	tc := tls.Server(&replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(read), c)}, cfg)
	if err := tc.Handshake(); err != nil {
		return
	}
	st := tc.ConnectionState()
	sc.ALPN = st.NegotiatedProtocol
	if st.DidResume {
		sc.Resumed, sc.From = true, from
	}
	ctx := context.WithValue(context.Background(), siteConnKey{}, sc)
	var conn net.Conn = tc
	if sc.ALPN == "h2" {
		var rec bytes.Buffer
		fp, err := readH2Start(io.TeeReader(tc, &rec))
		if err != nil {
			return
		}
		sc.H2 = fp
		// Handed on as if over plain TCP: the server sees the preface and
		// speaks HTTP/2.
		conn = &replayConn{Conn: tc, r: io.MultiReader(&rec, tc)}
	}
	_ = c.SetDeadline(time.Time{})
	s.mu.Lock()
	idle := s.idle
	s.mu.Unlock()
	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	l := &oneConnListener{c: conn, addr: tc.LocalAddr(), done: make(chan struct{})}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idle, Protocols: protos,
		ConnContext: func(context.Context, net.Conn) context.Context { return ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				l.Close()
			}
		}}
	go func() { _ = srv.Serve(l) }()
	<-l.done
}

// readH2Start reads the client preface and frames up to the first whole
// HEADERS, and returns their fingerprint.
func readH2Start(r io.Reader) (string, error) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(r, preface); err != nil || string(preface) != http2.ClientPreface {
		return "", fmt.Errorf("no HTTP/2 preface: %q %v", preface, err)
	}
	fr := http2.NewFramer(io.Discard, r)
	fr.ReadMetaHeaders = hpack.NewDecoder(65536, nil)
	var settings, prio []string
	wu := "00"
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return "", err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			_ = f.ForeachSetting(func(st http2.Setting) error {
				settings = append(settings, fmt.Sprintf("%d:%d", st.ID, st.Val))
				return nil
			})
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				wu = strconv.FormatUint(uint64(f.Increment), 10)
			}
		case *http2.PriorityFrame:
			prio = append(prio, fmt.Sprintf("%d:%d:%d:%d", f.StreamID, b2i(f.Exclusive), f.StreamDep, int(f.Weight)+1))
		case *http2.MetaHeadersFrame:
			var pseudo []string
			for _, hf := range f.Fields {
				if strings.HasPrefix(hf.Name, ":") {
					pseudo = append(pseudo, hf.Name[1:2])
				}
			}
			if len(prio) == 0 {
				prio = []string{"0"}
			}
			return strings.Join(settings, ";") + "|" + wu + "|" + strings.Join(prio, ",") + "|" + strings.Join(pseudo, ","), nil
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ServeHTTP answers {"path":..., "proto":...}, or a rule's status.
func (s *Site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	status := http.StatusOK
	s.mu.Lock()
	if rule := s.rules[r.URL.Path]; rule != nil && rule.times != 0 {
		rule.times--
		status = rule.status
		for k, v := range rule.header {
			w.Header().Set(k, v)
		}
	}
	s.mu.Unlock()
	if sc, ok := r.Context().Value(siteConnKey{}).(*Conn); ok {
		sc.mu.Lock()
		sc.Requests = append(sc.Requests, Request{Path: r.URL.Path, UserAgent: r.UserAgent(), Proto: r.Proto, Status: status})
		sc.mu.Unlock()
	}
	if strings.HasSuffix(r.URL.Path, "/info/refs") && r.URL.Query().Get("service") == "git-upload-pack" {
		// An empty Git repository, over smart HTTP: git ls-remote succeeds.
		w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(status)
		caps := strings.Repeat("0", 40) + " capabilities^{}\x00report-status agent=fpsite\n"
		fmt.Fprintf(w, "001e# service=git-upload-pack\n0000%04x%s0000", len(caps)+4, caps)
		return
	}
	if r.URL.Path == "/" || strings.HasSuffix(r.URL.Path, ".html") {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(status)
		fmt.Fprintf(w, "<!doctype html><html><body><div id=\"out\">served %d over %s</div></body></html>", status, r.Proto)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "proto": r.Proto})
}

// SetPathRule answers the next times requests for path with status and
// header (times < 0: every one).
func (s *Site) SetPathRule(path string, times, status int, header map[string]string) {
	s.mu.Lock()
	s.rules[path] = &siteRule{times: times, status: status, header: header}
	s.mu.Unlock()
}

// SetIdleTimeout makes the site close an HTTP/1.1 connection idle for d,
// without a word, as servers do (0: the default, minutes).
func (s *Site) SetIdleTimeout(d time.Duration) {
	s.mu.Lock()
	s.idle = d
	s.mu.Unlock()
}

// Conns are the connections seen so far, in the order they arrived.
func (s *Site) Conns() []*Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Conn(nil), s.conns...)
}

// Reset forgets the connections seen so far.
func (s *Site) Reset() {
	s.mu.Lock()
	s.conns = nil
	s.mu.Unlock()
}

// Seen returns a copy of the connection's requests.
func (sc *Conn) Seen() []Request {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return append([]Request(nil), sc.Requests...)
}

// URL is the site's https:// base URL.
func (s *Site) URL() string { return "https://" + s.ln.Addr().String() }

// Addr is the site's host:port.
func (s *Site) Addr() string { return s.ln.Addr().String() }

// CertPEM is the certificate of the CA that issued the site's, to trust it.
func (s *Site) CertPEM() []byte { return s.certPEM }

// Close stops the site.
func (s *Site) Close() {
	_ = s.ln.Close()
}

// replayConn reads from r (bytes already read put back before the socket).
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// oneConnListener hands one connection to http.Server.Serve.
type oneConnListener struct {
	c    net.Conn
	addr net.Addr
	once sync.Once
	done chan struct{}
	mu   sync.Mutex
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.c
	l.c = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.addr }
