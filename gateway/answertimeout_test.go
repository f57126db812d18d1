package gateway

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// silentUpstream accepts connections and never sends a byte. Its name
// sorts first, so the store tries it first.
func silentUpstream(t *testing.T) pool.Member {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return pool.Member{Name: "a-silent", URL: &url.URL{Scheme: "http", Host: ln.Addr().String()}}
}

func TestASilentMemberCostsTheAnswerTimeoutNotTheRequestDeadline(t *testing.T) {
	site := startSite(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "site")
	}))
	tests := []struct {
		name   string
		method string
		body   string
		status int
		reason string
	}{
		{name: "a GET goes on to the next member", method: http.MethodGet, status: http.StatusOK},
		{name: "a POST is 504 member_timeout, not sent twice", method: http.MethodPost, body: "order=1",
			status: http.StatusGatewayTimeout, reason: fault.ReasonMemberTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			silent := silentUpstream(t)
			tlsSite := httptest.NewTLSServer(http.NotFoundHandler())
			t.Cleanup(tlsSite.Close)
			answering := startAnsweringUpstream(t, tlsSite)
			e := newEnv(t, Options{AllowPrivateTargets: true, Mode: rotation.ModeRequest, Retries: 2,
				MemberAnswerTimeout: 300 * time.Millisecond, DialTimeout: time.Second, RequestTimeout: time.Minute},
				pool.StoreOptions{}, silent, answering)
			req, err := http.NewRequest(tt.method, site+"/x", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			resp, err := e.client("", "").Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.status || resp.Header.Get(HeaderReason) != tt.reason {
				t.Fatalf("%s: %s %q, want %d %q", tt.method, resp.Status, resp.Header.Get(HeaderReason), tt.status, tt.reason)
			}
			if d := time.Since(start); d > 30*time.Second {
				t.Fatalf("took %v: the request deadline, not the answer timeout", d)
			}
			// The member that answered nothing, not even a request it needs
			// no site for, is out for every site.
			poll.Until(t, 20*time.Second, "the silent member out for every site", func() error {
				if n := e.rec.failuresOf(silent.Name); n != 1 {
					return fmt.Errorf("%d failures of the silent member, want 1", n)
				}
				return nil
			})
			if n := e.rec.failuresOf(answering.Name); n != 0 {
				t.Fatalf("%d failures of the answering member", n)
			}
		})
	}
}
