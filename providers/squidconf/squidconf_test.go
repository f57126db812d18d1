package squidconf

import (
	"net/netip"
	"strings"
	"testing"
)

func TestSquidConfigRules(t *testing.T) {
	conf := Config{
		Name:    "proxy-abc",
		Port:    8080,
		Denied:  append(DefaultDeniedDestinations(), netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("10.96.0.0/12")),
		Clients: DefaultClientCIDRs(),
	}.Render()
	lines := strings.Split(conf, "\n")
	index := func(line string) int {
		for i, l := range lines {
			if l == line {
				return i
			}
		}
		t.Errorf("squid.conf lacks the line %q:\n%s", line, conf)
		return -1
	}
	order := []string{
		"http_access deny manager",
		"http_access deny !Safe_ports",
		"http_access deny CONNECT !SSL_ports",
		"http_access deny to_localhost",
		"http_access deny proxyfleet_denied",
		"http_access allow proxyfleet_clients",
		"http_access deny all",
	}
	last := -1
	for _, l := range order {
		i := index(l)
		if i <= last {
			t.Errorf("%q is out of order", l)
		}
		last = i
	}
	for _, l := range []string{"http_port 8080", "visible_hostname proxy-abc", "acl SSL_ports port 443", "via off", "forwarded_for delete", "access_log none", "cache deny all"} {
		index(l)
	}
	var denied string
	for _, l := range lines {
		if strings.HasPrefix(l, "acl proxyfleet_denied dst ") {
			denied = l
		}
	}
	for _, cidr := range []string{"10.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "::1/128", "fc00::/7", "fe80::/10", "203.0.113.0/24"} {
		if !strings.Contains(denied+" ", " "+cidr+" ") {
			t.Errorf("denied destinations lack %s: %s", cidr, denied)
		}
	}
	if strings.Contains(denied, "10.96.0.0/12") {
		t.Errorf("a cluster CIDR inside 10.0.0.0/8 must be merged away (Squid would drop 10.0.0.0/8): %s", denied)
	}
}

func TestMergePrefixes(t *testing.T) {
	in := []netip.Prefix{
		netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("fc00::/7"), netip.MustParsePrefix("203.0.113.0/24"),
		netip.MustParsePrefix("0.0.0.0/8"),
	}
	got := JoinPrefixes(MergePrefixes(in))
	if want := "0.0.0.0/8 10.0.0.0/8 203.0.113.0/24 fc00::/7"; got != want {
		t.Fatalf("MergePrefixes = %s, want %s", got, want)
	}
}

func TestRenderRefusesAnOpenSquid(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Render made a Squid that allows any client without authentication")
		}
	}()
	Config{Name: "p", Port: 3128, Denied: DefaultDeniedDestinations()}.Render()
}

func TestRenderWithAuthDemandsTheLoginBeforeAllowing(t *testing.T) {
	conf := Config{Name: "p", Port: 3128, Denied: DefaultDeniedDestinations(),
		Auth: &Auth{Helper: DefaultNCSAHelper, PasswordFile: "/etc/squid/pw"}}.Render()
	deny := strings.Index(conf, "http_access deny !proxyfleet_auth\n")
	allow := strings.Index(conf, "http_access allow proxyfleet_clients proxyfleet_auth\n")
	dst := strings.Index(conf, "http_access deny proxyfleet_denied\n")
	if deny < 0 || allow < 0 || !(dst < deny && deny < allow) {
		t.Fatalf("want destination denials, then the 407, then the authenticated allow:\n%s", conf)
	}
	if !strings.Contains(conf, "acl proxyfleet_clients src all\n") {
		t.Fatalf("no client ranges with auth means any source:\n%s", conf)
	}
}
