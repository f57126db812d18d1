//go:build !nomirror

package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
)

// pqSite is an HTTPS site of the test's own (Go's crypto/tls) that, like a
// front rolling out post-quantum key exchange, insists on
// SecP256r1MLKEM768 from every client whose hello lists it (asking for a
// key share with a HelloRetryRequest when there is none), and takes x25519
// or P-256 from the others. uTLS cannot do SecP256r1MLKEM768: a hello that
// lists it cannot be completed by the gateway against this site. It
// records, per connection, where it came from and whether the hello
// listed the group.
type pqSite struct {
	*httptest.Server
	roots *x509.CertPool
	mu    sync.Mutex
	seen  []pqHello
}

type pqHello struct {
	source string
	pq     bool
}

func startPQSite(t *testing.T, host string) *pqSite {
	t.Helper()
	cert, _, err := testutil.SelfSignedCert(net.ParseIP(host))
	if err != nil {
		t.Fatal(err)
	}
	s := &pqSite{Server: httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "served")
	}))}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s.Listener = ln
	base := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
	s.TLS = &tls.Config{GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
		pq := slices.Contains(hi.SupportedCurves, tls.SecP256r1MLKEM768)
		src, _, _ := net.SplitHostPort(hi.Conn.RemoteAddr().String())
		s.mu.Lock()
		s.seen = append(s.seen, pqHello{source: src, pq: pq})
		s.mu.Unlock()
		cfg := base.Clone()
		cfg.CurvePreferences = []tls.CurveID{tls.X25519, tls.CurveP256}
		if pq {
			cfg.CurvePreferences = []tls.CurveID{tls.SecP256r1MLKEM768}
		}
		return cfg, nil
	}}
	s.StartTLS()
	t.Cleanup(s.Close)
	s.roots = x509.NewCertPool()
	s.roots.AppendCertsFromPEM(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}))
	return s
}

func (s *pqSite) hellos() []pqHello {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}

// TestMITMOwnHandshakeFailureFallsBackBlamingNoOne: a client whose
// ClientHello the gateway mirrors but cannot complete with the site (it
// lists SecP256r1MLKEM768, as Go 1.26's does, which the site then insists
// on in a HelloRetryRequest and uTLS cannot do) is served at once through the same member with the closest preset;
// no member rests for the site, no member failure is counted, the answer
// took one attempt, and the log and the metric say which hello fell back
// and why. Before, the site's 502 target_unreachable ("TLS to the site:
// ...") rested the member for the site.
func TestMITMOwnHandshakeFailureFallsBackBlamingNoOne(t *testing.T) {
	squids, members := squidMembers(t,
		squid.Options{Name: "own-a", OutgoingAddr: "127.0.0.227"},
		squid.Options{Name: "own-b", OutgoingAddr: "127.0.0.228"},
	)
	bySource := map[string]string{}
	for _, s := range squids {
		bySource[s.OutgoingAddr()] = s.Name()
	}
	site := startPQSite(t, "127.0.0.229")
	ca, caRoots := newTestCA(t)
	logs := &testutil.LockedBuffer{}
	e := newEnv(t, Options{Retries: 2, AllowPrivateTargets: true, SiteRoots: site.roots,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		MITM:   &MITMOptions{CA: ca, Fingerprint: FingerprintMirror}}, pool.StoreOptions{}, members...)

	// Go's own client: its hello lists the group (key shares
	// X25519MLKEM768 and x25519, which uTLS makes).
	proxy, _ := url.Parse("http://" + e.addr)
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy),
		TLSClientConfig: &tls.Config{RootCAs: caRoots}}}
	t.Cleanup(c.CloseIdleConnections)
	for i := range 2 {
		resp := getWithUA(t, c, site.URL+"/", "pq-client")
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderAttempts) != "1" {
			t.Fatalf("request %d: %d after %s attempts (%s), want a 200 after 1", i, resp.StatusCode, resp.Header.Get(HeaderAttempts), resp.Header.Get(HeaderReason))
		}
	}
	seen := site.hellos()
	if len(seen) != 2 || !seen[0].pq || seen[1].pq || seen[0].source != seen[1].source {
		t.Fatalf("the site saw %+v; want the mirrored hello (listing the group), then a preset's through the same member, and no more\n%s", seen, logs)
	}
	siteHost := "127.0.0.229"
	for _, m := range e.store.Members() {
		if _, rests := m.Cooldowns[siteHost]; rests {
			t.Fatalf("%s rests for the site: the gateway's own handshake failure was blamed on it (%+v)", m.Name, m.Cooldowns)
		}
	}
	e.rec.mu.Lock()
	failures, fallbacks := len(e.rec.failures), e.rec.fallbacks["group"]
	e.rec.mu.Unlock()
	if failures != 0 || fallbacks != 1 {
		t.Fatalf("member failures %d, fallbacks for group %d; want none and 1", failures, fallbacks)
	}
	log := logs.String()
	if !strings.Contains(log, "failed on the gateway's side") || !strings.Contains(log, "reason=group") ||
		!strings.Contains(log, "member="+bySource[seen[0].source]) || !strings.Contains(log, "JA3 ") {
		t.Fatalf("log:\n%s\nwant a line saying the client's hello (its JA3) fell back through %s, and why", log, bySource[seen[0].source])
	}
}
