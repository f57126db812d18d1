package bootstrap

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/internal/testkit/dnssink"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/squidconf"
)

// TestBootstrapSquidConfAndPasswordFileWorkUnderRealSquid runs the squid.conf
// and the htpasswd file the bootstrap writes under this machine's real Squid
// (5.7 from Debian) and its real basic_ncsa_auth helper, changing only what
// is the VM's and not the test's: the listen address (127.0.0.1 instead of
// every address), the password file's path, and the resolver (a name server
// of the test's own that never answers, and a hosts file naming one inward
// host). It proves the config parses and serves, that the helper accepts the
// login against the bcrypt hash and refuses a wrong password, that Squid
// answers 407 without the login or with a wrong one at once, without looking
// up the name asked for, and that the port and destination rules still
// refuse a logged-in client. (The controller's gcp and kvm envtests run this
// password file in a real Squid that a logged-in probe gets through.)
func TestBootstrapSquidConfAndPasswordFileWorkUnderRealSquid(t *testing.T) {
	login := providers.BasicAuth{Username: "proxyfleet", Password: "Vm-l0gin-" + squid.ServiceName()}
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	// Every lookup Squid makes goes to dns, which never answers: a request
	// that needs one waits dnsTimeout, far longer than the answers asked
	// for here may take (deadline), so only an answer given without a
	// lookup arrives at all.
	dns := dnssink.Start(t)
	const dnsTimeout, deadline = 2 * time.Minute, time.Minute
	const (
		nowhere = "nowhere.proxyfleet.invalid"   // no address anywhere
		inward  = "inward.proxyfleet.invalid"    // the hosts file's 10.20.30.40
		lookup  = "looked-up.proxyfleet.invalid" // no address: the logged-in control
	)
	var squidDir string
	addr := squid.StartConf(t, "vm-bootstrap", func(port int, dir string) squid.ConfFiles {
		squidDir = dir
		ud, err := Squid("proxy-realsquid", port, login)
		if err != nil {
			t.Fatal(err)
		}
		var cc cloudConfig
		if err := yaml.Unmarshal(ud, &cc); err != nil {
			t.Fatal(err)
		}
		files := map[string]string{}
		for _, f := range cc.WriteFiles {
			files[f.Path] = f.Content
		}
		conf, htpasswd := files[SquidConfPath], files[PasswordFilePath]
		if conf == "" || htpasswd == "" || strings.Contains(string(ud), login.Password) {
			t.Fatalf("bootstrap lacks squid.conf or the password file, or carries the password:\n%s", ud)
		}
		listen := "http_port " + strconv.Itoa(port) + "\n"
		if !strings.Contains(conf, listen) || !strings.Contains(conf, " "+PasswordFilePath+"\n") {
			t.Fatalf("squid.conf has no %q or no %s:\n%s", listen, PasswordFilePath, conf)
		}
		conf = strings.Replace(conf, listen, "http_port 127.0.0.1:"+strconv.Itoa(port)+"\n", 1)
		conf = strings.Replace(conf, " "+PasswordFilePath+"\n", " "+dir+"/htpasswd\n", 1)
		conf += "dns_nameservers " + dns.IP() + "\n" +
			"dns_timeout " + strconv.Itoa(int(dnsTimeout.Seconds())) + " seconds\n" +
			"hosts_file " + dir + "/hosts\n"
		return squid.ConfFiles{Conf: conf, Files: map[string]string{
			"htpasswd": htpasswd,
			"hosts":    "10.20.30.40 " + inward + "\n",
		}}
	})

	// ask sends one request through the VM's Squid with user info u (nil:
	// none): a GET of an absolute URL, or a CONNECT to a host:port. It
	// returns the status and Squid's error page name (X-Squid-Error).
	ask := func(t *testing.T, u *url.Userinfo, method, target string) (int, string) {
		t.Helper()
		resp, err := testutil.AskProxy(addr, u, method, target, deadline)
		if err != nil {
			t.Fatalf("%s %s through the bootstrap Squid: %v (no answer within %s means Squid waited on a lookup: its name server never answers)", method, target, err, deadline)
		}
		return resp.StatusCode, resp.Header.Get("X-Squid-Error")
	}
	right := url.UserPassword(login.Username, login.Password)
	wrong := url.UserPassword(login.Username, login.Password+"x")

	// No destination here is one the bootstrap allows (every local server
	// is on loopback, and no test sends traffic off this machine), so the
	// login's acceptance is asked of the helper itself: the program and the
	// file the config names, as Squid runs it (one "user password" line in,
	// OK or ERR out). Squid shows the refusals.
	helper := exec.Command(squidconf.DefaultNCSAHelper, filepath.Join(squidDir, "htpasswd"))
	helper.Stdin = strings.NewReader(login.Username + " " + login.Password + "\n" + login.Username + " " + login.Password + "x\n")
	out, err := helper.Output()
	if err != nil {
		t.Fatalf("%s: %v", squidconf.DefaultNCSAHelper, err)
	}
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 2 ||
		strings.TrimSpace(lines[0]) != "OK" || !strings.HasPrefix(lines[1], "ERR") {
		t.Fatalf("basic_ncsa_auth over the bootstrap's password file answered %q, want OK for the login and ERR for a wrong password", out)
	}
	site := "203.0.113.10" // TEST-NET-3: public, never contacted (every request for it is refused first)

	for _, tc := range []struct {
		name     string
		user     *url.Userinfo
		method   string
		target   string
		code     int
		squidErr string
	}{
		{"no login is refused with a challenge", nil, http.MethodGet, "http://" + site + "/", http.StatusProxyAuthRequired, "ERR_CACHE_ACCESS_DENIED"},
		{"a wrong password is refused", wrong, http.MethodGet, "http://" + site + "/", http.StatusProxyAuthRequired, "ERR_CACHE_ACCESS_DENIED"},
		{"no login for an unresolvable name is challenged without a lookup", nil, http.MethodGet, "http://" + nowhere + "/", http.StatusProxyAuthRequired, "ERR_CACHE_ACCESS_DENIED"},
		{"a wrong password for an unresolvable name is refused without a lookup", wrong, http.MethodGet, "http://" + nowhere + "/", http.StatusProxyAuthRequired, "ERR_CACHE_ACCESS_DENIED"},
		{"no login for a tunnel to an unresolvable name is challenged without a lookup", nil, http.MethodConnect, nowhere + ":443", http.StatusProxyAuthRequired, "ERR_CACHE_ACCESS_DENIED"},
		{"no login for a tunnel to a refused port is challenged, not told the policy", nil, http.MethodConnect, site + ":22", http.StatusProxyAuthRequired, "ERR_CACHE_ACCESS_DENIED"},
		{"a logged-in client still cannot reach loopback", right, http.MethodGet, target.URL() + "/", http.StatusForbidden, "ERR_ACCESS_DENIED"},
		{"a logged-in client still cannot reach the metadata server", right, http.MethodGet, "http://169.254.169.254/computeMetadata/v1/", http.StatusForbidden, "ERR_ACCESS_DENIED"},
		{"a logged-in client still cannot reach a private address", right, http.MethodGet, "http://10.20.30.40/", http.StatusForbidden, "ERR_ACCESS_DENIED"},
		{"a logged-in client still cannot reach a name that resolves inward", right, http.MethodGet, "http://" + inward + "/", http.StatusForbidden, "ERR_ACCESS_DENIED"},
		{"a logged-in client still cannot tunnel to a name that resolves inward", right, http.MethodConnect, inward + ":443", http.StatusForbidden, "ERR_ACCESS_DENIED"},
		{"a logged-in client still cannot tunnel to a port other than 443", right, http.MethodConnect, site + ":22", http.StatusForbidden, "ERR_ACCESS_DENIED"},
		{"a logged-in client still cannot send plain HTTP to a low port other than 80 and 443", right, http.MethodGet, "http://" + site + ":25/", http.StatusForbidden, "ERR_ACCESS_DENIED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, squidErr := ask(t, tc.user, tc.method, tc.target)
			if code != tc.code || !strings.HasPrefix(squidErr, tc.squidErr) {
				t.Fatalf("%s %s: %d %q, want %d %s", tc.method, tc.target, code, squidErr, tc.code, tc.squidErr)
			}
		})
	}
	if n := dns.Asked(nowhere); n != 0 {
		t.Fatalf("Squid sent %d queries for %s, asked for only without a valid login: it resolves names for strangers", n, nowhere)
	}
	if n := target.Count("127.0.0.1"); n != 0 {
		t.Fatalf("the loopback target was reached %d times through the bootstrap Squid", n)
	}

	// The control: a logged-in request for a name Squid does not know makes
	// it ask dns (and wait), so the silence above is the gate's doing, not a
	// resolver Squid never uses.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		proxy := &url.URL{Scheme: "http", Host: addr, User: right}
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+lookup+"/", nil)
		if resp, err := c.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	poll.Until(t, deadline, "Squid's lookup of the logged-in client's name", func() error {
		if dns.Asked(lookup) == 0 {
			return fmt.Errorf("Squid has not asked its name server for %s, the name a logged-in client wants", lookup)
		}
		return nil
	})
}
