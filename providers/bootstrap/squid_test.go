package bootstrap

import (
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"
	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/providers"
)

func TestBootstrapIsCloudConfigWithSquidAndItsLogin(t *testing.T) {
	auth := providers.BasicAuth{Username: "proxyfleet", Password: "Zq8-random-password"}
	ud, err := Squid("proxy-abc", 3128, auth)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(ud), "#cloud-config\n") {
		t.Fatalf("user-data must start with #cloud-config:\n%s", ud)
	}
	var cc cloudConfig
	if err := yaml.UnmarshalStrict(ud, &cc); err != nil {
		t.Fatalf("user-data is not cloud-config: %v\n%s", err, ud)
	}
	if len(cc.Packages) != 1 || cc.Packages[0] != "squid" {
		t.Fatalf("packages = %v, want squid", cc.Packages)
	}
	files := map[string]writeFile{}
	for _, f := range cc.WriteFiles {
		files[f.Path] = f
	}
	conf, ok := files[SquidConfPath]
	if !ok {
		t.Fatalf("no %s in write_files", SquidConfPath)
	}
	for _, line := range []string{
		"http_port 3128",
		"acl SSL_ports port 443",
		"acl Safe_ports port 80 443 1025-65535",
		"http_access deny CONNECT !SSL_ports",
		"http_access deny to_localhost",
		"http_access deny proxyfleet_denied",
		"auth_param basic program /usr/lib/squid/basic_ncsa_auth " + PasswordFilePath,
		"http_access deny !proxyfleet_auth",
		"http_access allow proxyfleet_clients proxyfleet_auth",
		"http_access deny all",
		"via off",
		"forwarded_for delete",
		"cache deny all",
	} {
		if !strings.Contains("\n"+conf.Content, "\n"+line+"\n") {
			t.Errorf("squid.conf lacks %q:\n%s", line, conf.Content)
		}
	}
	var denied, firstRule string
	for _, l := range strings.Split(conf.Content, "\n") {
		if strings.HasPrefix(l, "acl proxyfleet_denied dst ") {
			denied = l + " "
		}
		if firstRule == "" && strings.HasPrefix(l, "http_access ") {
			firstRule = l
		}
	}
	if firstRule != "http_access deny !proxyfleet_auth" {
		t.Errorf("the first http_access rule is %q, want the login (nothing about the request before it)", firstRule)
	}
	for _, cidr := range []string{"169.254.0.0/16", "10.0.0.0/8", "127.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fe80::/10"} {
		if !strings.Contains(denied, " "+cidr+" ") {
			t.Errorf("denied destinations lack %s (metadata, private, loopback, link-local): %s", cidr, denied)
		}
	}
	if strings.Contains(conf.Content, auth.Password) {
		t.Fatal("squid.conf carries the plain password")
	}
	pw, ok := files[PasswordFilePath]
	if !ok || pw.Permissions != "0640" || pw.Owner != "root:proxy" {
		t.Fatalf("password file %+v: want it written 0640 root:proxy (readable by Squid's helper from its first start, by nobody else)", pw)
	}
	user, hash, ok := strings.Cut(strings.TrimSpace(pw.Content), ":")
	if !ok || user != auth.Username {
		t.Fatalf("password file = %q, want %s:<hash>", pw.Content, auth.Username)
	}
	if err := bcrypt.CompareHashAndPassword([]byte(hash), []byte(auth.Password)); err != nil {
		t.Fatalf("the password file does not verify the Proxy's password: %v", err)
	}
	if strings.Contains(string(ud), auth.Password) {
		t.Fatal("the user-data carries the plain password; only its hash belongs there")
	}
	last := cc.RunCmd[len(cc.RunCmd)-1]
	if len(last) != 3 || last[0] != "sh" || last[2] != StartSquid || !strings.HasPrefix(StartSquid, "systemctl start squid || ") {
		t.Fatalf("runcmd ends with %v, want Squid started unless it runs, never restarted (and its journal shown when it fails)", last)
	}
	for _, c := range cc.RunCmd {
		if strings.Contains(strings.Join(c, " "), "restart") {
			t.Fatalf("runcmd %v restarts Squid: its port closes after a probe may have found the Proxy Ready", c)
		}
	}
}

func TestBootstrapRefusesUnusableLogins(t *testing.T) {
	for _, tt := range []struct {
		name string
		auth providers.BasicAuth
		want string
	}{
		{"no password", providers.BasicAuth{Username: "u"}, "needs a user name and a password"},
		{"no user", providers.BasicAuth{Password: "p"}, "needs a user name and a password"},
		{"colon in the user", providers.BasicAuth{Username: "a:b", Password: "p"}, "must not contain ':'"},
		{"newline in the password", providers.BasicAuth{Username: "u", Password: "p\nq"}, "line breaks"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Squid("proxy-abc", 3128, tt.auth); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
