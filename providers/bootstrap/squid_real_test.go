package bootstrap

import (
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/squidconf"
)

// TestBootstrapSquidConfAndPasswordFileWorkUnderRealSquid runs the squid.conf
// and the htpasswd file the bootstrap writes under this machine's real Squid
// (5.7 from Debian) and its real basic_ncsa_auth helper, changing only what
// is the VM's and not the test's: the listen address (127.0.0.1 instead of
// every address) and the password file's path. It proves the config parses
// and serves, that the helper accepts the login against the bcrypt hash and
// refuses a wrong password, that Squid answers 407 without the login or with
// a wrong one, and that the destination rules still refuse inward targets
// for a logged-in client. (The controller's gcp and kvm envtests runs this password
// file in a real Squid that a logged-in probe gets through.)
func TestBootstrapSquidConfAndPasswordFileWorkUnderRealSquid(t *testing.T) {
	login := providers.BasicAuth{Username: "proxyfleet", Password: "Vm-l0gin-" + testutil.SquidServiceName()}
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	var squidDir string
	addr := testutil.StartSquidConf(t, "vm-bootstrap", func(port int, dir string) testutil.SquidConfFiles {
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
		return testutil.SquidConfFiles{Conf: conf, Files: map[string]string{"htpasswd": htpasswd}}
	})

	// get sends one GET through the VM's Squid with user info u (nil: none)
	// and returns the status and Squid's error page name (X-Squid-Error).
	get := func(u *url.Userinfo, rawURL string) (int, string) {
		t.Helper()
		proxy := &url.URL{Scheme: "http", Host: addr, User: u}
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}, Timeout: 20 * time.Second}
		resp, err := c.Get(rawURL)
		if err != nil {
			t.Fatalf("GET %s through the bootstrap Squid: %v", rawURL, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
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
	site := "http://203.0.113.10/" // TEST-NET-3: public, never contacted (the login is refused first)

	for _, tc := range []struct {
		name     string
		user     *url.Userinfo
		url      string
		code     int
		squidErr string
	}{
		{"no login is refused with a challenge", nil, site, http.StatusProxyAuthRequired, "ERR_CACHE_ACCESS_DENIED"},
		{"a wrong password is refused", wrong, site, http.StatusProxyAuthRequired, "ERR_CACHE_ACCESS_DENIED"},
		{"a logged-in client still cannot reach loopback", right, target.URL() + "/", http.StatusForbidden, "ERR_ACCESS_DENIED"},
		{"a logged-in client still cannot reach the metadata server", right, "http://169.254.169.254/computeMetadata/v1/", http.StatusForbidden, "ERR_ACCESS_DENIED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, squidErr := get(tc.user, tc.url)
			if code != tc.code || !strings.HasPrefix(squidErr, tc.squidErr) {
				t.Fatalf("GET %s: %d %q, want %d %s", tc.url, code, squidErr, tc.code, tc.squidErr)
			}
		})
	}
	if n := target.Count("127.0.0.1"); n != 0 {
		t.Fatalf("the loopback target was reached %d times through the bootstrap Squid", n)
	}
}
