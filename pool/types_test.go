package pool

import (
	"net/netip"
	"net/url"
	"testing"
)

func TestMemberSameEndpoint(t *testing.T) {
	mustURL := func(raw string) *url.URL {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	proxy := Member{Name: "p", URL: mustURL("http://u:pw@127.0.0.1:3128")}
	tests := []struct {
		name string
		a, b Member
		want bool
	}{
		{name: "the same URL parsed twice is the same endpoint", a: proxy,
			b: Member{Name: "p", URL: mustURL("http://u:pw@127.0.0.1:3128")}, want: true},
		{name: "attributes and name do not matter", a: proxy,
			b: Member{Name: "q", URL: proxy.URL, Attributes: map[string]string{"region": "eu"}}, want: true},
		{name: "another password is a new endpoint", a: proxy,
			b: Member{URL: mustURL("http://u:other@127.0.0.1:3128")}, want: false},
		{name: "another user is a new endpoint", a: proxy,
			b: Member{URL: mustURL("http://v:pw@127.0.0.1:3128")}, want: false},
		{name: "dropping the credentials is a new endpoint", a: proxy,
			b: Member{URL: mustURL("http://127.0.0.1:3128")}, want: false},
		{name: "another port is a new endpoint", a: proxy,
			b: Member{URL: mustURL("http://u:pw@127.0.0.1:3129")}, want: false},
		{name: "another scheme is a new endpoint", a: proxy,
			b: Member{URL: mustURL("socks5://u:pw@127.0.0.1:3128")}, want: false},
		{name: "direct and proxied differ", a: proxy, b: DirectMember(), want: false},
		{name: "direct members with one source address are the same", a: Member{SourceAddr: netip.MustParseAddr("127.0.0.2")},
			b: Member{SourceAddr: netip.MustParseAddr("127.0.0.2")}, want: true},
		{name: "another source address is a new endpoint", a: Member{SourceAddr: netip.MustParseAddr("127.0.0.2")},
			b: Member{SourceAddr: netip.MustParseAddr("127.0.0.3")}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.a.SameEndpoint(tt.b); got != tt.want {
				t.Fatalf("SameEndpoint = %v, want %v", got, tt.want)
			}
			if got := tt.b.SameEndpoint(tt.a); got != tt.want {
				t.Fatalf("SameEndpoint (swapped) = %v, want %v", got, tt.want)
			}
		})
	}
}
