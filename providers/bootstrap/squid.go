// Package bootstrap builds the cloud-init every proxyfleet VM boots when its
// Proxy brings no cloud-init of its own: Squid with the shared generated
// configuration and the Proxy's basic-auth login. Every VM provider (gcp,
// kvm) uses this one builder, so a VM on any backend is never an open proxy
// and a fix to the bootstrap reaches all of them at once.
//
// It imports providers and providers/squidconf only; never a provider
// implementation.
package bootstrap

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/bcrypt"
	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/squidconf"
)

// Paths the bootstrap writes on the VM.
const (
	// SquidConfPath replaces the distribution's squid.conf.
	SquidConfPath = "/etc/squid/squid.conf"
	// PasswordFilePath is the htpasswd file Squid's NCSA helper reads.
	PasswordFilePath = "/etc/squid/proxyfleet.htpasswd"
)

// StartSquid is the bootstrap's last command: Squid started when it is not
// running and, when it does not come up, its status and its journal (where
// Squid reports a line of squid.conf it cannot parse) printed before the
// command fails. cloud-init copies a command's output to the serial console
// and to /var/log/cloud-init-output.log, so an operator reading the console
// (virsh console, a cloud's serial port output) sees why the VM never
// answers.
//
// It never restarts a Squid that runs: the configuration and the login are
// on disk before Squid first starts (cloud-init writes files in its first
// stage, which Debian's squid unit, ordered after network-online, follows;
// a package the bootstrap installs starts after that), so a running Squid
// already serves them, and a restart would close its port for seconds
// (shutdown_lifetime, then a start) after the health probe may have found
// the Proxy Ready — requests the gateway sends then are refused.
const StartSquid = "systemctl start squid || { systemctl --no-pager --full status squid; journalctl --no-pager -b -u squid -n 60; exit 1; }"

// bcryptCost keeps hashing cheap for Squid's helper; the password is random
// and long, so the hash's work factor is not what protects it.
const bcryptCost = 10

// cloudConfig is the subset of cloud-config the bootstrap uses.
type cloudConfig struct {
	PackageUpdate bool        `json:"package_update"`
	Packages      []string    `json:"packages"`
	WriteFiles    []writeFile `json:"write_files"`
	RunCmd        [][]string  `json:"runcmd"`
}

type writeFile struct {
	Path        string `json:"path"`
	Permissions string `json:"permissions"`
	Owner       string `json:"owner"`
	Content     string `json:"content"`
}

// Squid returns the cloud-init user-data a VM boots with when its Proxy
// has no spec.cloudInit: install Squid and run it with the configuration the
// kubernetes provider generates (no cache, no Via or X-Forwarded-For, CONNECT
// only to 443, plain HTTP only to 80, 443 and 1025 and up, private, loopback,
// link-local and metadata destinations refused after resolution), plus basic
// authentication with auth, checked before any rule about the request, so a
// stranger is answered 407 before Squid resolves a name for them. The VM
// answers on every address, since gateways reach it from wherever they run;
// the login, and the firewall rule the docs ask for, are what keep it from
// being an open proxy.
//
// The files are written before the package is installed, and the package
// manager keeps an existing squid.conf, so Squid never runs with the
// distribution's defaults. The password file is readable by the proxy group
// only: Debian's base-passwd defines that group (gid 13) on every system,
// before any squid package exists, so the helper can read the login the
// first time Squid starts.
func Squid(name string, port int, auth providers.BasicAuth) ([]byte, error) {
	if err := checkLogin(auth); err != nil {
		return nil, err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(auth.Password), bcryptCost)
	if err != nil {
		return nil, fmt.Errorf("hashing the proxy password: %w", err)
	}
	conf := squidconf.Config{
		Name:   name,
		Port:   port,
		Denied: squidconf.DefaultDeniedDestinations(),
		Auth:   &squidconf.Auth{Helper: squidconf.DefaultNCSAHelper, PasswordFile: PasswordFilePath},
	}
	cc := cloudConfig{
		PackageUpdate: true,
		Packages:      []string{"squid"},
		WriteFiles: []writeFile{
			{Path: SquidConfPath, Permissions: "0644", Owner: "root:root", Content: conf.Render()},
			{Path: PasswordFilePath, Permissions: "0640", Owner: "root:proxy", Content: auth.Username + ":" + string(hash) + "\n"},
		},
		RunCmd: [][]string{
			{"systemctl", "enable", "squid"},
			{"sh", "-c", StartSquid},
		},
	}
	body, err := yaml.Marshal(cc)
	if err != nil {
		return nil, err
	}
	return append([]byte("#cloud-config\n"), body...), nil
}

// checkLogin refuses logins Squid or the htpasswd format cannot carry.
func checkLogin(a providers.BasicAuth) error {
	switch {
	case a.Username == "" || a.Password == "":
		return errors.New("the proxy login needs a user name and a password")
	case strings.ContainsAny(a.Username, ":\n\r \t"):
		return errors.New("the proxy user name must not contain ':' or whitespace")
	case strings.ContainsAny(a.Password, "\n\r"):
		return errors.New("the proxy password must not contain line breaks")
	case len(a.Password) > 72:
		return errors.New("the proxy password is longer than bcrypt's 72 bytes")
	}
	return nil
}
