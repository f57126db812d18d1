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

func TestNoMatchErrorAddSumsThePartsAndKeepsTheFirstBack(t *testing.T) {
	tests := []struct {
		name  string
		parts []NoMatchError
		want  NoMatchError
	}{
		{"counts add up", []NoMatchError{{Considered: 2, InCooldown: 1, Unhealthy: 1}, {Considered: 3, AtCapacity: 3}},
			NoMatchError{Considered: 5, InCooldown: 1, Unhealthy: 1, AtCapacity: 3}},
		{"the first member back in any part is the first back", []NoMatchError{{Considered: 1, InCooldown: 1, RetryAfterSeconds: 30}, {Considered: 1, InCooldown: 1, RetryAfterSeconds: 5}, {}},
			NoMatchError{Considered: 2, InCooldown: 2, RetryAfterSeconds: 5}},
		{"a part without a known return adds none", []NoMatchError{{Considered: 1, Unhealthy: 1}, {Considered: 1, InCooldown: 1, RetryAfterSeconds: 9}},
			NoMatchError{Considered: 2, Unhealthy: 1, InCooldown: 1, RetryAfterSeconds: 9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sum NoMatchError
			for i := range tt.parts {
				sum.Add(&tt.parts[i])
			}
			if sum != tt.want {
				t.Fatalf("sum %+v, want %+v", sum, tt.want)
			}
		})
	}
}
