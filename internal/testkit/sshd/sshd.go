// Package sshd runs a private, real OpenSSH server (Debian's /usr/sbin/sshd)
// for a test, with a host key and an authorised client key made for it and
// unix-socket forwarding on: how the kvm provider reaches a libvirtd, and
// so what its tests and internal/testkit/libvirtd's hosts dial.
//
// It imports internal/testutil (the child process) and nothing else of
// ours: no provider code and no other launcher in internal/testkit.
package sshd

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// Server is a private, real OpenSSH server on 127.0.0.1 for one test: its own
// config, a host key generated for it, one authorised client key, and
// stream-local (unix socket) forwarding on, which is how the kvm provider
// reaches libvirt. The machine's own sshd and its config are never touched.
type Server struct {
	// Addr is 127.0.0.1:port.
	Addr string
	// User is the login (the user the tests run as).
	User string
	// KeyFile is the client's private key (OpenSSH format).
	KeyFile string
	// KnownHostsFile lists this server's host key under Addr.
	KnownHostsFile string
	// Dir holds the config, keys and log.
	Dir string

	proc *testutil.Process
}

// Start starts the server on a free loopback port.
func Start(t testing.TB) *Server {
	t.Helper()
	const bin = "/usr/sbin/sshd"
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("sshd test harness: %s is missing (run hack/install-deps.sh as root: openssh-server): %v", bin, err)
	}
	// OpenSSH refuses to start without its privilege-separation directory,
	// which the package's service unit creates at boot.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatalf("sshd test harness: %v", err)
	}
	dir := t.TempDir()
	s := &Server{Dir: dir, User: currentUser(t), KeyFile: filepath.Join(dir, "client_key"), KnownHostsFile: filepath.Join(dir, "known_hosts")}
	hostKey := writeKey(t, filepath.Join(dir, "host_key"))
	clientKey := writeKey(t, s.KeyFile)
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), ssh.MarshalAuthorizedKey(clientKey.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	s.proc, _ = testutil.StartProcessOnFreePorts(t, bin, 1, func(addrs []string) testutil.ProcessOptions {
		s.Addr = addrs[0]
		_, port, _ := net.SplitHostPort(addrs[0])
		conf := strings.Join([]string{
			"Port " + port,
			"ListenAddress 127.0.0.1",
			"HostKey " + filepath.Join(dir, "host_key"),
			"PidFile " + filepath.Join(dir, "sshd.pid"),
			"AuthorizedKeysFile " + filepath.Join(dir, "authorized_keys"),
			"AuthenticationMethods publickey",
			"PubkeyAuthentication yes",
			"PasswordAuthentication no",
			"KbdInteractiveAuthentication no",
			"PermitRootLogin prohibit-password",
			"AllowUsers " + s.User,
			"AllowStreamLocalForwarding yes",
			"AllowTcpForwarding local",
			"AllowAgentForwarding no",
			"X11Forwarding no",
			"PermitTTY no",
			"UsePAM no",
			"StrictModes no",
			"LogLevel VERBOSE",
			"",
		}, "\n")
		if err := os.WriteFile(filepath.Join(dir, "sshd_config"), []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		return testutil.ProcessOptions{Name: "sshd", Args: []string{"-D", "-e", "-f", filepath.Join(dir, "sshd_config")}, WaitAddrs: addrs}
	})
	s.WriteKnownHosts(t, s.KnownHostsFile, hostKey.PublicKey())
	return s
}

// WriteKnownHosts writes a known_hosts file at path naming key as the host
// key of s.Addr; tests pass another key to simulate a changed host.
func (s *Server) WriteKnownHosts(t testing.TB, path string, key ssh.PublicKey) {
	t.Helper()
	line := knownhosts.Line([]string{knownhosts.Normalize(s.Addr)}, key) + "\n"
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Log is the server's output (its verbose log).
func (s *Server) Log() string { return s.proc.Output() }

// NewKey writes a fresh ed25519 private key at path and returns its signer.
func NewKey(t testing.TB, path string) ssh.Signer { return writeKey(t, path) }

func writeKey(t testing.TB, path string) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return signer
}

func currentUser(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("USER"); u != "" && os.Geteuid() != 0 {
		return u
	}
	if os.Geteuid() == 0 {
		return "root"
	}
	t.Fatal(fmt.Errorf("sshd test harness: cannot tell the current user (USER is unset)"))
	return ""
}
