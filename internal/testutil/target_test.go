package testutil

import (
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
