package testutil

import (
	"encoding/pem"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
)

func TestTargetAnswersRulesPerSourceAndRecordsHeaders(t *testing.T) {
	t.Parallel()
	target := StartTarget(t, TargetOptions{Host: "127.0.0.7"})
	target.SetRule("127.0.0.1", http.StatusTooManyRequests, map[string]string{"Retry-After": "2"})
	c := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer c.CloseIdleConnections()

	resp, ans, err := GetAnswer(c, target.URL()+"/limited", http.Header{"X-Test": {"kept"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" || ans.Status != 429 {
		t.Fatalf("got %s Retry-After %q, want 429 with Retry-After 2", resp.Status, resp.Header.Get("Retry-After"))
	}
	reqs := target.Requests()
	if len(reqs) != 1 || reqs[0].Header.Get("X-Test") != "kept" || reqs[0].Source != "127.0.0.1" || reqs[0].Status != 429 {
		t.Fatalf("recorded %+v, want one 429 request from 127.0.0.1 with X-Test", reqs)
	}

	target.ClearRule("127.0.0.1")
	resp, _, err = GetAnswer(c, target.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after ClearRule: %s, want 200", resp.Status)
	}
	if got := target.Count("127.0.0.1"); got != 2 {
		t.Fatalf("count %d, want 2", got)
	}
	target.Reset()
	if target.Total() != 0 || len(target.Requests()) != 0 {
		t.Fatal("Reset left counts or requests behind")
	}
}

func TestTargetCountsConcurrentRequestsAndKeepsARecentRing(t *testing.T) {
	t.Parallel()
	target := StartTarget(t, TargetOptions{})
	c := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8}}
	defer c.CloseIdleConnections()
	const workers, each = 8, 600 // more than the ring holds
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if _, _, err := GetAnswer(c, target.URL()+"/"+strconv.Itoa(w), nil); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := target.Count("127.0.0.1"); got != workers*each {
		t.Fatalf("count %d, want %d", got, workers*each)
	}
	reqs := target.Requests()
	if len(reqs) != recentRequests {
		t.Fatalf("ring holds %d, want %d", len(reqs), recentRequests)
	}
	for i := 1; i < len(reqs); i++ {
		if reqs[i].Time.Before(reqs[i-1].Time) {
			t.Fatalf("requests not oldest first at %d", i)
		}
	}
}

func TestTLSTargetIsVerifiableWithItsPool(t *testing.T) {
	t.Parallel()
	target := StartTLSTarget(t, TargetOptions{Host: "127.0.0.6"})
	good := &http.Client{Transport: &http.Transport{Proxy: nil, TLSClientConfig: target.ClientTLSConfig()}}
	defer good.CloseIdleConnections()
	if resp, _, err := GetAnswer(good, target.URL(), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("verified client: %v", err)
	}
	bad := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer bad.CloseIdleConnections()
	if _, _, err := GetAnswer(bad, target.URL(), nil); err == nil {
		t.Fatal("a client without the target's pool accepted its certificate")
	}
}

func TestTargetPathRulesBodiesAndClientHellos(t *testing.T) {
	t.Parallel()
	target := StartTLSTarget(t, TargetOptions{Host: "127.0.0.8"})
	target.SetPathRule("/first", 1, http.StatusTooManyRequests, map[string]string{"Retry-After": "9"}, "")
	target.SetRuleBody("127.0.0.1", 200, nil, "<html>captcha</html>")
	tr := &http.Transport{Proxy: nil, TLSClientConfig: target.ClientTLSConfig()}
	tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	c := &http.Client{Transport: tr}
	defer c.CloseIdleConnections()

	resp, _, _ := GetAnswer(c, target.URL()+"/first", nil)
	if resp == nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "9" {
		t.Fatalf("first request to a path rule: %v, want 429 Retry-After 9", resp)
	}
	resp, err := c.Get(target.URL() + "/first")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "<html>captcha</html>" {
		t.Fatalf("second request: %d %q, want the source rule's 200 page", resp.StatusCode, body)
	}
	if block, _ := pem.Decode(target.CertPEM()); block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("CertPEM is not a PEM certificate: %q", target.CertPEM())
	}
	hellos := target.ClientHellos()
	if len(hellos) != 1 || hellos[0].Source != "127.0.0.1" || len(hellos[0].CipherSuites) == 0 ||
		len(hellos[0].Extensions) == 0 || len(hellos[0].ALPN) != 1 || hellos[0].ALPN[0] != "http/1.1" {
		t.Fatalf("recorded hellos %+v, want one from 127.0.0.1 with suites, extensions and ALPN http/1.1", hellos)
	}
}
