package squidconf

import (
	"net/netip"
	"slices"
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
	for _, want := range []string{"http_port 8080", "visible_hostname proxy-abc", "acl SSL_ports port 443", "via off", "forwarded_for delete", "access_log none", "cache deny all"} {
		if !slices.Contains(lines, want) {
			t.Errorf("squid.conf lacks the line %q:\n%s", want, conf)
		}
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

// gateACLTypes are the ACL types a rule may use before the gate has let the
// request through: the client's address and its login. Every other type
// names something about the request, and dst (to_localhost included) makes
// Squid resolve the name first.
var gateACLTypes = map[string]bool{"src": true, "proxy_auth": true}

// builtinACLTypes are the ACLs Squid predefines that the rules use.
var builtinACLTypes = map[string]string{"all": "src", "manager": "url_regex", "localhost": "src", "to_localhost": "dst"}

func TestRenderChecksTheClientBeforeAnythingAboutTheRequest(t *testing.T) {
	private := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	login := &Auth{Helper: DefaultNCSAHelper, PasswordFile: "/etc/squid/pw"}
	requestRules := []string{
		"http_access deny manager",
		"http_access deny !Safe_ports",
		"http_access deny CONNECT !SSL_ports",
		"http_access deny to_localhost",
		"http_access deny proxyfleet_denied",
	}
	rules := func(gate []string, tail ...string) []string {
		return append(append(append([]string{}, gate...), requestRules...), tail...)
	}
	for _, tt := range []struct {
		name string
		conf Config
		// gate is the rule that must come before every rule about the request.
		gate string
		want []string
	}{
		{
			name: "a VM Squid asks for the login before it looks at the request",
			conf: Config{Auth: login},
			gate: "http_access deny !proxyfleet_auth",
			want: rules([]string{"http_access deny !proxyfleet_auth"},
				"http_access allow proxyfleet_clients proxyfleet_auth", "http_access deny all"),
		},
		{
			name: "a Squid with a login and client ranges refuses other sources, then asks for the login",
			conf: Config{Auth: login, Clients: private},
			gate: "http_access deny !proxyfleet_auth",
			want: rules([]string{"http_access deny !proxyfleet_clients", "http_access deny !proxyfleet_auth"},
				"http_access allow proxyfleet_clients proxyfleet_auth", "http_access deny all"),
		},
		{
			name: "a Pod Squid without a login refuses other sources before it looks at the request",
			conf: Config{Clients: DefaultClientCIDRs()},
			gate: "http_access deny !proxyfleet_clients",
			want: rules([]string{"http_access deny !proxyfleet_clients"},
				"http_access allow proxyfleet_clients", "http_access deny all"),
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.conf.Name, tt.conf.Port, tt.conf.Denied = "p", 3128, DefaultDeniedDestinations()
			conf := tt.conf.Render()
			types := map[string]string{}
			for k, v := range builtinACLTypes {
				types[k] = v
			}
			var access []string
			for _, l := range strings.Split(conf, "\n") {
				f := strings.Fields(l)
				switch {
				case len(f) >= 3 && f[0] == "acl":
					types[f[1]] = f[2]
				case len(f) >= 2 && f[0] == "http_access":
					access = append(access, l)
				}
			}
			if strings.Join(access, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("http_access rules:\n%s\nwant:\n%s", strings.Join(access, "\n"), strings.Join(tt.want, "\n"))
			}
			// However the rules change, none before the gate may need more
			// than the client's address and login.
			for _, l := range access {
				if l == tt.gate {
					return
				}
				for _, name := range strings.Fields(l)[2:] {
					name = strings.TrimPrefix(name, "!")
					typ, ok := types[name]
					if !ok {
						t.Fatalf("%q uses the ACL %s, which is neither defined nor a known built-in", l, name)
					}
					if !gateACLTypes[typ] {
						t.Fatalf("%q (a %s ACL) is evaluated before %q: a stranger's request would be judged on what it names", l, typ, tt.gate)
					}
				}
			}
			t.Fatalf("no %q among the rules", tt.gate)
		})
	}
}

func TestRenderWithAuthAndNoClientRangesAcceptsAnySource(t *testing.T) {
	conf := Config{Name: "p", Port: 3128, Denied: DefaultDeniedDestinations(),
		Auth: &Auth{Helper: DefaultNCSAHelper, PasswordFile: "/etc/squid/pw"}}.Render()
	if !strings.Contains(conf, "acl proxyfleet_clients src all\n") {
		t.Fatalf("no client ranges with auth means any source:\n%s", conf)
	}
}
