package gateway

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// TestBanRulesOverPlainHTTP: a body rule reads a gzip-encoded 200
// challenge as a ban and retries; an answer no rule needs the body of is
// not read ahead; every relayed answer says how many members it took.
func TestBanRulesOverPlainHTTP(t *testing.T) {
	rules, err := rotation.ParseBanRules([]string{"status=200 body~(?i)verify\\syou\\sare\\shuman action=banned", "preset=cloudflare-challenge"})
	if err != nil {
		t.Fatal(err)
	}
	c := rotation.DefaultClassifier()
	c.Rules = rules
	members := directMembers(2)
	e := newEnv(t, Options{Retries: 2, AllowPrivateTargets: true, Classifier: c}, pool.StoreOptions{}, members...)
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.61"})
	client := e.client("", "")

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("<html>Please verify you are human</html>"))
	_ = zw.Close()
	site.SetPathRule("/gz", 1, 200, map[string]string{"Content-Encoding": "gzip"}, gz.String())
	resp, a := get(t, client, site.URL()+"/gz", nil)
	if resp.StatusCode != 200 || a.Path != "/gz" || resp.Header.Get(HeaderAttempts) != "2" {
		t.Fatalf("got %d %+v after %q attempts, want the retried JSON answer after 2", resp.StatusCode, a, resp.Header.Get(HeaderAttempts))
	}

	site.SetPathRule("/cf", -1, 503, map[string]string{"Cf-Mitigated": "challenge"}, "challenge")
	req, _ := http.NewRequest("GET", site.URL()+"/cf", nil)
	r, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	// The member banned by /gz rests for the site, so only the other one
	// is left; its challenge is delivered as the site sent it.
	if r.StatusCode != 503 || string(body) != "challenge" || r.Header.Get(HeaderAttempts) != "1" {
		t.Fatalf("got %d %q after %q attempts, want the challenge delivered after the one member left", r.StatusCode, body, r.Header.Get(HeaderAttempts))
	}
	if n := len(site.Requests()); n != 3 {
		t.Fatalf("the site saw %d requests, want 3", n)
	}
	for _, m := range e.store.Members() {
		if _, ok := m.Cooldowns[site.Host()]; !ok {
			t.Fatalf("%s does not rest for the site after the challenges", m.Name)
		}
	}
}
