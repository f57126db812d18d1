package leaseapi

import (
	"net/http"
	"testing"
)

func TestClientDefaultTransportIgnoresEnvironmentProxy(t *testing.T) {
	t.Setenv("HTTP_PROXY", "http://127.0.0.1:1")
	t.Setenv("HTTPS_PROXY", "http://127.0.0.1:1")
	for _, tc := range []struct {
		name string
		hc   *http.Client
	}{
		{"no client given", nil},
		{"client without a transport", &http.Client{}},
		{"client with the environment proxy", &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient("http://127.0.0.1:8090", "", tc.hc)
			if err != nil {
				t.Fatal(err)
			}
			tr, ok := c.httpc.Transport.(*http.Transport)
			if !ok {
				t.Fatalf("transport is %T", c.httpc.Transport)
			}
			if tr.Proxy != nil {
				t.Error("the client's transport has a Proxy func")
			}
			if tc.hc != nil && c.httpc == tc.hc {
				t.Error("the caller's http.Client was used, not a copy")
			}
		})
	}
}
