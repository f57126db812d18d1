package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/mitmca"
	sitespkg "github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// newTestCA makes and loads a fresh MITM CA, and a pool that trusts it.
func newTestCA(t testing.TB) (*mitmca.CA, *x509.CertPool) {
	t.Helper()
	certPEM, keyPEM, err := mitmca.Generate("proxyfleet test CA", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := mitmca.Load(certPEM, keyPEM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ca.Close)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	return ca, roots
}

// mitmClient is a client proxying through the gateway that trusts roots
// for the sites' certificates; every new connection to the gateway is
// counted in dials.
func mitmClient(t *testing.T, gwAddr string, roots *x509.CertPool, connectHeader http.Header, dials *atomic.Int64) *http.Client {
	t.Helper()
	var d net.Dialer
	tr := &http.Transport{
		Proxy:              http.ProxyURL(&url.URL{Scheme: "http", Host: gwAddr}),
		ProxyConnectHeader: connectHeader,
		TLSClientConfig:    &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials != nil {
				dials.Add(1)
			}
			return d.DialContext(ctx, network, addr)
		},
	}
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

type mitmAnswer struct {
	status   int
	body     string
	header   http.Header
	issuer   string // the certificate the client saw
	attempts string
}

func mitmDo(t *testing.T, c *http.Client, method, u string, body io.Reader) mitmAnswer {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, u, err)
	}
	a := mitmAnswer{status: resp.StatusCode, body: string(b), header: resp.Header, attempts: resp.Header.Get(HeaderAttempts)}
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		a.issuer = resp.TLS.PeerCertificates[0].Issuer.CommonName
	}
	return a
}

// TestMITMThroughRealSquids intercepts HTTPS through two real Squids to
// real TLS targets: what plain HTTP gets (bans read, cooldowns, retries,
// ban rules) now works inside CONNECT tunnels too.
func TestMITMThroughRealSquids(t *testing.T) {
	squids := squid.StartAll(t,
		squid.Options{Name: "mitm-a", OutgoingAddr: "127.0.0.41"},
		squid.Options{Name: "mitm-b", OutgoingAddr: "127.0.0.42"},
	)
	nameBySource := map[string]string{}
	var members []pool.Member
	for _, s := range squids {
		u, err := url.Parse(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, pool.Member{Name: s.Name(), URL: u})
		nameBySource[s.OutgoingAddr()] = s.Name()
	}
	// One site per case, each on its own address: cooldowns are per site.
	sites := map[string]*testutil.Target{}
	siteRoots := x509.NewCertPool()
	for i, name := range []string{"429", "403", "body", "post", "keepalive", "bypass", "header-off", "mint"} {
		tg := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0." + strconv.Itoa(51+i)})
		siteRoots.AppendCertsFromPEM(tg.CertPEM())
		sites[name] = tg
	}
	untrusted := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.60"})

	rules, err := rotation.ParseBanRules([]string{`status=200 body~(?i)solve\sthe\scaptcha action=banned`})
	if err != nil {
		t.Fatal(err)
	}
	classifier := rotation.DefaultClassifier()
	classifier.Rules = rules
	ca, caRoots := newTestCA(t)
	bypass, err := sitespkg.ParseHosts([]string{sites["bypass"].Host()})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, Options{Retries: 2, AllowPrivateTargets: true, Classifier: classifier, SiteRoots: siteRoots,
		MITM: &MITMOptions{CA: ca, Bypass: bypass}}, pool.StoreOptions{}, members...)

	// bannedFirst returns the member that carried the site's first
	// (refused) answer and checks that it now rests for that site only.
	bannedFirst := func(t *testing.T, site *testutil.Target, status int, minRest time.Duration) string {
		t.Helper()
		reqs := site.Requests()
		if len(reqs) < 2 || reqs[0].Status != status || reqs[1].Status != 200 || reqs[0].Source == reqs[1].Source {
			t.Fatalf("the site saw %+v, want a %d through one Squid, then a 200 through the other", reqs, status)
		}
		name := nameBySource[reqs[0].Source]
		for _, m := range e.store.Members() {
			until, ok := m.Cooldowns[site.Host()]
			if m.Name == name && (!ok || time.Until(until) < minRest) {
				t.Fatalf("%s carried the %d but rests for %s until %v, want at least %s", name, status, site.Host(), until, minRest)
			}
			if m.Name != name && ok {
				t.Fatalf("%s served the retry, yet it rests for %s", m.Name, site.Host())
			}
			if _, all := m.Cooldowns[""]; all {
				t.Fatalf("%s rests for every site after a site's ban", m.Name)
			}
		}
		return name
	}

	t.Run("a 429 with Retry-After cools that Squid down for the site and the GET is retried on the other", func(t *testing.T) {
		site := sites["429"]
		site.SetPathRule("/rl", 1, http.StatusTooManyRequests, map[string]string{"Retry-After": "120"}, "")
		c := mitmClient(t, e.addr, caRoots, nil, nil)
		a := mitmDo(t, c, "GET", site.URL()+"/rl", nil)
		if a.status != 200 || a.attempts != "2" || a.issuer != "proxyfleet test CA" {
			t.Fatalf("got %d attempts %q cert by %q: %s; want the retried 200 after 2 attempts, under the MITM CA", a.status, a.attempts, a.issuer, a.body)
		}
		banned := bannedFirst(t, site, 429, 100*time.Second)
		if a.header.Get(HeaderProxy) == banned || a.header.Get(HeaderLease) == "" {
			t.Fatalf("answer headers %v: want the other member's name and a lease", a.header)
		}
		for i := 0; i < 5; i++ {
			if a := mitmDo(t, c, "GET", site.URL()+"/after", nil); a.status != 200 || a.header.Get(HeaderProxy) == banned || a.attempts != "1" {
				t.Fatalf("after the ban: %d via %s (%s attempts), want 200 through the other member at once", a.status, a.header.Get(HeaderProxy), a.attempts)
			}
		}
	})

	t.Run("a 403 counts as a ban and the GET is retried", func(t *testing.T) {
		site := sites["403"]
		site.SetPathRule("/b", 1, http.StatusForbidden, nil, "")
		a := mitmDo(t, mitmClient(t, e.addr, caRoots, nil, nil), "GET", site.URL()+"/b", nil)
		if a.status != 200 || a.attempts != "2" {
			t.Fatalf("got %d after %q attempts, want the retried 200 after 2", a.status, a.attempts)
		}
		bannedFirst(t, site, 403, time.Minute)
	})

	t.Run("a 200 challenge page matched by a body rule is a ban; the last one is delivered unchanged", func(t *testing.T) {
		site := sites["body"]
		page := "<html><body>Please solve the CAPTCHA to continue</body></html>"
		site.SetPathRule("/c", 1, 200, nil, page)
		c := mitmClient(t, e.addr, caRoots, nil, nil)
		a := mitmDo(t, c, "GET", site.URL()+"/c", nil)
		if a.status != 200 || a.attempts != "2" || strings.Contains(a.body, "CAPTCHA") {
			t.Fatalf("got %d after %q attempts: %q; want the real page from the retry", a.status, a.attempts, a.body)
		}
		bannedFirst(t, site, 200, time.Minute)

		// Every member answers the challenge: after the retries the
		// client gets the site's page byte for byte.
		site.SetPathRule("/always", -1, 200, map[string]string{"X-Challenge": "1"}, page)
		a = mitmDo(t, c, "GET", site.URL()+"/always", nil)
		if a.status != 200 || a.body != page || a.header.Get("X-Challenge") != "1" {
			t.Fatalf("got %d %q, want the challenge page unchanged", a.status, a.body)
		}
	})

	t.Run("a POST is not retried", func(t *testing.T) {
		site := sites["post"]
		site.SetPathRule("/p", 1, http.StatusTooManyRequests, map[string]string{"Retry-After": "30"}, "")
		a := mitmDo(t, mitmClient(t, e.addr, caRoots, nil, nil), "POST", site.URL()+"/p", strings.NewReader("form=1"))
		if a.status != 429 || a.attempts != "1" {
			t.Fatalf("got %d after %q attempts, want the site's 429 after 1", a.status, a.attempts)
		}
		if n := len(site.Requests()); n != 1 {
			t.Fatalf("the site saw %d requests, want the one POST", n)
		}
	})

	t.Run("keep-alive inside one tunnel serves many requests", func(t *testing.T) {
		site := sites["keepalive"]
		var dials atomic.Int64
		c := mitmClient(t, e.addr, caRoots, nil, &dials)
		for i := 0; i < 40; i++ {
			if a := mitmDo(t, c, "GET", site.URL()+"/k", nil); a.status != 200 || a.header.Get(HeaderProxy) == "" {
				t.Fatalf("request %d: %d %s", i, a.status, a.body)
			}
		}
		if n := dials.Load(); n != 1 {
			t.Fatalf("40 requests took %d connections to the gateway, want 1 (keep-alive in the tunnel)", n)
		}
		if n := site.Total(); n != 40 {
			t.Fatalf("the site answered %d requests, want 40", n)
		}
	})

	t.Run("a bypassed host is tunnelled untouched", func(t *testing.T) {
		site := sites["bypass"]
		before := ca.Minted()
		a := mitmDo(t, mitmClient(t, e.addr, site.CertPool(), nil, nil), "GET", site.URL()+"/raw", nil)
		if a.status != 200 || !strings.HasPrefix(a.issuer, "testutil target") {
			t.Fatalf("got %d with a certificate by %q, want the site's own certificate", a.status, a.issuer)
		}
		if ca.Minted() != before {
			t.Fatal("a leaf was minted for a bypassed host")
		}
	})

	t.Run("X-Proxyfleet-Mitm: off on the CONNECT keeps a plain tunnel", func(t *testing.T) {
		site := sites["header-off"]
		off := http.Header{HeaderMITM: {"off"}}
		a := mitmDo(t, mitmClient(t, e.addr, site.CertPool(), off, nil), "GET", site.URL()+"/raw", nil)
		if a.status != 200 || !strings.HasPrefix(a.issuer, "testutil target") {
			t.Fatalf("got %d with a certificate by %q, want the site's own certificate", a.status, a.issuer)
		}
		// Without the header the same client would see the MITM leaf,
		// which it does not trust.
		req, _ := http.NewRequest("GET", site.URL()+"/mitm", nil)
		if _, err := mitmClient(t, e.addr, site.CertPool(), nil, nil).Do(req); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("without the header: %v, want a certificate error (the MITM leaf)", err)
		}
	})

	t.Run("a site certificate that does not verify is a 502 with a reason", func(t *testing.T) {
		a := mitmDo(t, mitmClient(t, e.addr, caRoots, nil, nil), "GET", untrusted.URL()+"/x", nil)
		if a.status != 502 || a.header.Get(HeaderReason) != fault.ReasonSiteCertificate || !strings.Contains(a.body, "does not verify") {
			t.Fatalf("got %d reason %q: %q; want 502 site_certificate saying why", a.status, a.header.Get(HeaderReason), a.body)
		}
		if a.attempts != "1" || untrusted.Total() != 0 {
			t.Fatalf("attempts %q, site answered %d: want one attempt and no request reaching the site", a.attempts, untrusted.Total())
		}
		for _, m := range e.store.Members() {
			if _, rests := m.Cooldowns[untrusted.Host()]; rests || e.rec.failuresOf(m.Name) > 0 {
				t.Fatalf("%s was blamed for the site's certificate: %+v", m.Name, m.Cooldowns)
			}
		}
	})

	t.Run("concurrent first requests to one host mint one certificate", func(t *testing.T) {
		site := sites["mint"]
		before := ca.Minted()
		var wg sync.WaitGroup
		errs := make(chan string, 16)
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := mitmClient(t, e.addr, caRoots, nil, nil)
				resp, err := c.Get(site.URL() + "/m")
				if err != nil {
					errs <- err.Error()
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs <- resp.Status
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		if n := ca.Minted() - before; n != 1 {
			t.Fatalf("16 concurrent first tunnels minted %d certificates, want 1", n)
		}
	})
}
