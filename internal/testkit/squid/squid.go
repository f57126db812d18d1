// Package squid runs real Squid (Debian's /usr/sbin/squid) for a test:
// Start, StartAll and Launch run the tests' own configuration, with an
// outgoing address per instance, an optional login, a port kept across
// Stop/Kill and Start, and a self-probe that proves the Squid answering is
// this one; StartConf runs a configuration under test (a provider's
// generated squid.conf) as it is. Each Squid lives in a directory of its
// own and under a service name of its own, so parallel test packages never
// share one.
//
// It imports internal/testutil (free ports, stopping a child) and nothing
// else of ours: no gateway, pool or provider code, and no other launcher in
// internal/testkit, so a test links Squid only when it starts one.
package squid

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// Binary is where Debian installs Squid.
const Binary = "/usr/sbin/squid"

// ServiceName returns a fresh name for `squid -n`. Squid names its
// shared-memory segments after it (/dev/shm/<name>-cf__metadata.shm): with
// the default name, Squids starting at the same moment (test packages run in
// parallel) collide with "shm_open(...): File exists" and one dies.
func ServiceName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "pftest" + hex.EncodeToString(b[:])
}

// RemoveShm removes the shared-memory segments of a Squid that has
// exited under service name name; a killed Squid leaves them behind.
func RemoveShm(name string) {
	matches, _ := filepath.Glob("/dev/shm/" + name + "-*")
	for _, m := range matches {
		_ = os.Remove(m)
	}
}

// squidMissing is the failure message when Squid is absent: the suites never skip.
const squidMissing = "squid not installed: run make test as root (it apt-installs squid) or apt-get install squid"

// Options configures one Squid instance.
type Options struct {
	// OutgoingAddr is Squid's tcp_outgoing_address (a 127.0.0.N), the source
	// address targets see for everything this Squid forwards, CONNECT tunnels
	// included. Empty lets the kernel choose (127.0.0.1).
	OutgoingAddr string
	// Name labels the instance in logs and prefixes its visible_hostname,
	// which is made unique per instance.
	Name string
	// ListenIP is the loopback address Squid listens on (default 127.0.0.1):
	// with distinct ListenIPs several Squids can share one Port, as pods
	// with distinct pod IPs share the container port.
	ListenIP string
	// Port is the port to listen on; 0 picks a free one. A fixed port that
	// is taken is retried until StartTimeout.
	Port int
	// ExtraConfig lines are appended to the generated squid.conf.
	ExtraConfig []string
	// PortOptions are appended to the http_port line (the bench's ssl-bump
	// Squid: "ssl-bump tls-cert=... generate-host-certificates=on").
	PortOptions string
	// Binary is the squid to run (default Binary, the installed one; the
	// bench runs an unpacked squid-openssl for ssl-bump).
	Binary string
	// AccessFirst lines (http_access rules and the acls they use) come
	// before the rule that lets loopback clients in, so a test can make a
	// Squid refuse something (Squid takes the first matching rule).
	AccessFirst []string
	// StartTimeout bounds how long a start waits for Squid to proxy a request
	// (default 30s).
	StartTimeout time.Duration
	// BasicAuth, when set, makes Squid demand this login from every client
	// (Squid's basic_ncsa_auth helper over an htpasswd file), as a VM's
	// bootstrap Squid or a commercial upstream does; the startup self-probe
	// then logs in with it.
	BasicAuth *Login
}

// Login is the login an authenticating test Squid demands.
type Login struct {
	// Username and Password are what clients (and the self-probe) send.
	Username, Password string
	// Htpasswd, when set, is written as the password file as it is (for
	// example the one a VM's bootstrap carries), instead of a bcrypt line
	// made from Username and Password: the self-probe then proves that this
	// file accepts the login.
	Htpasswd string
}

// NCSAHelper is where Debian installs Squid's basic-auth helper.
const NCSAHelper = "/usr/lib/squid/basic_ncsa_auth"

// Squid is one Squid run in the foreground (squid -N) as a child process, on a
// fixed 127.0.0.1 port that survives Stop/Kill and Start, so a restarted Squid
// is the same upstream to whoever points at it.
type Squid struct {
	opts     Options
	dir      string
	hostname string
	tb       testing.TB // nil for Launch

	mu      sync.Mutex
	port    int
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has exited
	exitErr error
}

// Start starts a Squid for the test and stops it, and removes its
// directory, at cleanup; on failure the tail of its cache.log is in the test
// log. A missing Squid fails the test (never skips).
func Start(t testing.TB, opts Options) *Squid {
	t.Helper()
	s, err := newSquid(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.tb = t
	t.Cleanup(func() { s.cleanup(t) })
	if err := s.start(s.opts.Port != 0); err != nil {
		t.Fatal(err)
	}
	return s
}

// cleanup stops s at the end of t, logging its cache.log when t failed.
func (s *Squid) cleanup(t testing.TB) {
	if t.Failed() {
		t.Logf("squid %s (%s) cache.log tail:\n%s", s.opts.Name, s.Addr(), s.LogTail(4096))
	}
	if err := s.Close(); err != nil {
		t.Errorf("squid %s: %v", s.opts.Name, err)
	}
}

// StartAll starts one Squid per options concurrently (each takes about a
// second to come up) with Start's cleanup and logging, and fails the
// test if any of them cannot start.
func StartAll(t testing.TB, opts ...Options) []*Squid {
	t.Helper()
	squids := make([]*Squid, len(opts))
	errs := make([]error, len(opts))
	var wg sync.WaitGroup
	for i, o := range opts {
		s, err := newSquid(o)
		if err != nil {
			t.Fatal(err)
		}
		s.tb = t
		squids[i] = s
		t.Cleanup(func() { s.cleanup(t) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.start(s.opts.Port != 0)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return squids
}

// Launch starts a Squid outside a test (e2e/bench); the caller must Close it.
func Launch(opts Options) (*Squid, error) {
	s, err := newSquid(opts)
	if err != nil {
		return nil, err
	}
	if err := s.start(s.opts.Port != 0); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

func newSquid(opts Options) (*Squid, error) {
	if _, err := os.Stat(Binary); err != nil {
		if _, lerr := exec.LookPath("squid"); lerr != nil {
			return nil, errors.New(squidMissing)
		}
	}
	if opts.Name == "" {
		opts.Name = "squid"
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if opts.ListenIP == "" {
		opts.ListenIP = "127.0.0.1"
	}
	if ip := net.ParseIP(opts.ListenIP); ip == nil || !ip.IsLoopback() || ip.To4() == nil {
		return nil, fmt.Errorf("squid %s: ListenIP %q must be an IPv4 loopback address (127.0.0.N)", opts.Name, opts.ListenIP)
	}
	if opts.Port < 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("squid %s: Port %d out of range", opts.Name, opts.Port)
	}
	if opts.OutgoingAddr != "" {
		ip := net.ParseIP(opts.OutgoingAddr)
		if ip == nil || !ip.IsLoopback() || ip.To4() == nil {
			return nil, fmt.Errorf("squid %s: OutgoingAddr %q must be an IPv4 loopback address (127.0.0.N)", opts.Name, opts.OutgoingAddr)
		}
	}
	dir, err := squidDir(opts.Name)
	if err != nil {
		return nil, err
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return nil, err
	}
	return &Squid{
		opts:     opts,
		dir:      dir,
		port:     opts.Port,
		hostname: opts.Name + "-" + hex.EncodeToString(suffix),
		done:     closedChan(),
	}, nil
}

// squidDir makes a directory Squid can use after it drops to the proxy user:
// every parent traversable, the directory itself owned by proxy when we are
// root (t.TempDir is 0700 and root-owned, which Squid cannot write to).
func squidDir(name string) (string, error) {
	base := os.TempDir()
	if !traversable(base) {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "testsquid-"+sanitize(name)+"-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	if err := GiveToProxy(dir); err != nil {
		return "", err
	}
	return dir, nil
}

// GiveToProxy gives path, and everything under it, to the proxy user when
// we are root: Squid drops to that user, and what it reads or writes
// (its directory, a CA key, its certificate helper's database) must be
// its own. Not root: nothing to do.
func GiveToProxy(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("proxy")
	if err != nil {
		return fmt.Errorf("squid runs as user proxy when started as root, but that user is missing: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// traversable reports whether every directory from / down to dir lets others search it.
func traversable(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == "/" || d == "." {
			return true
		}
	}
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, s)
}

// errAddrInUse marks a start that failed because the port was taken; start
// retries with another port (or, on a restart, the same one later).
var errAddrInUse = errors.New("address already in use")

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Addr is the ip:port Squid listens on (127.0.0.1 unless ListenIP says otherwise).
func (s *Squid) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort(s.opts.ListenIP, strconv.Itoa(s.port))
}

// Port is the port Squid listens on; it stays the same across Stop/Kill and Start.
func (s *Squid) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// URL is the proxy URL to give a client or the gateway (http://ip:port).
func (s *Squid) URL() string { return "http://" + s.Addr() }

// LoginURL is URL with the login BasicAuth demands in its user info (just
// URL when the Squid demands none): what a gateway's --upstream takes.
func (s *Squid) LoginURL() string {
	a := s.basicAuth()
	if a == nil {
		return s.URL()
	}
	return (&url.URL{Scheme: "http", User: url.UserPassword(a.Username, a.Password), Host: s.Addr()}).String()
}

// Name is the name given in Options.
func (s *Squid) Name() string { return s.opts.Name }

// OutgoingAddr is the source address targets see for this Squid's traffic.
func (s *Squid) OutgoingAddr() string {
	if s.opts.OutgoingAddr == "" {
		return "127.0.0.1"
	}
	return s.opts.OutgoingAddr
}

// Hostname is the instance's unique visible_hostname (it appears in X-Cache).
func (s *Squid) Hostname() string { return s.hostname }

// Dir is the instance's directory (squid.conf, cache.log, squid.out).
func (s *Squid) Dir() string { return s.dir }

// PID is the running Squid's process id, 0 when it is not running.
func (s *Squid) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.exited() {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the Squid process is alive.
func (s *Squid) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil && !s.exited()
}

func (s *Squid) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Start starts a stopped or killed Squid again on the same port and waits
// until it proxies. It fails the test (panics outside one) when it cannot.
func (s *Squid) Start() {
	if s.tb != nil {
		s.tb.Helper()
	}
	s.must(s.start(true))
}

// Stop sends SIGTERM, waits for the exit (SIGKILL after 10s).
func (s *Squid) Stop() {
	if s.tb != nil {
		s.tb.Helper()
	}
	s.must(s.stop(syscall.SIGTERM, 10*time.Second))
}

// Kill sends SIGKILL, simulating a crash: open connections are reset.
func (s *Squid) Kill() {
	if s.tb != nil {
		s.tb.Helper()
	}
	s.must(s.stop(syscall.SIGKILL, 10*time.Second))
}

func (s *Squid) must(err error) {
	if err == nil {
		return
	}
	if s.tb != nil {
		s.tb.Helper()
		s.tb.Fatal(err)
	}
	panic(err)
}

// Close stops Squid and removes its directory.
func (s *Squid) Close() error {
	err := s.stop(syscall.SIGTERM, 10*time.Second)
	if rerr := os.RemoveAll(s.dir); err == nil {
		err = rerr
	}
	return err
}

// LogTail returns the last n bytes of cache.log and of Squid's stdout/stderr.
func (s *Squid) LogTail(n int) string {
	var b strings.Builder
	for _, f := range []string{"cache.log", "squid.out"} {
		data, err := os.ReadFile(filepath.Join(s.dir, f))
		if err != nil {
			continue
		}
		if len(data) > n {
			data = data[len(data)-n:]
		}
		fmt.Fprintf(&b, "--- %s ---\n%s", f, data)
	}
	return b.String()
}

// start runs Squid and waits until it proxies. samePort keeps the current
// port (a restart), retrying while something else holds it; otherwise a port
// taken between choosing and binding is replaced by another.
func (s *Squid) start(samePort bool) error {
	if s.Running() {
		return fmt.Errorf("squid %s: already running", s.opts.Name)
	}
	deadline := time.Now().Add(s.opts.StartTimeout)
	for attempt := 1; ; attempt++ {
		if !samePort {
			addr, err := testutil.FreeAddrOn(s.opts.ListenIP)
			if err != nil {
				return err
			}
			_, p, _ := net.SplitHostPort(addr)
			s.mu.Lock()
			s.port, _ = strconv.Atoi(p)
			s.mu.Unlock()
		}
		err := s.startOnce(deadline)
		if err == nil {
			return nil
		}
		if !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			return fmt.Errorf("squid %s (attempt %d): %w\n%s", s.opts.Name, attempt, err, s.LogTail(2048))
		}
		if samePort {
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func (s *Squid) writeConfig() (string, error) {
	s.mu.Lock()
	port := s.port
	s.mu.Unlock()
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	line("# generated by internal/testkit/squid for %s", s.opts.Name)
	line("http_port %s:%d %s", s.opts.ListenIP, port, s.opts.PortOptions)
	if s.opts.OutgoingAddr != "" {
		line("tcp_outgoing_address %s", s.opts.OutgoingAddr)
	}
	line("visible_hostname %s", s.hostname)
	line("pid_filename %s", filepath.Join(s.dir, "squid.pid"))
	line("cache_log %s", filepath.Join(s.dir, "cache.log"))
	line("coredump_dir %s", s.dir)
	line("access_log none")
	line("cache deny all")
	line("cache_mem 8 MB")
	// Clients are the tests and the gateway on loopback; any method, any
	// port (targets listen on random ports), no Safe_ports/SSL_ports rules.
	for _, l := range s.opts.AccessFirst {
		line("%s", l)
	}
	line("acl loopback_clients src 127.0.0.0/8")
	if a := s.basicAuth(); a != nil {
		pwFile, err := s.writePasswordFile(a)
		if err != nil {
			return "", err
		}
		line("auth_param basic program %s %s", NCSAHelper, pwFile)
		line("auth_param basic realm %s", s.opts.Name)
		line("auth_param basic children 3 startup=1 idle=1")
		line("acl logged_in proxy_auth REQUIRED")
		line("http_access deny !logged_in")
	}
	line("http_access allow loopback_clients")
	line("http_access deny all")
	// WebSocket handshakes in absolute form are carried (Squid 5 and up),
	// as the providers' Squids do.
	line("http_upgrade_request_protocols websocket allow all")
	line("via off")
	line("forwarded_for delete")
	line("shutdown_lifetime 0 seconds")
	line("pinger_enable off")
	line("netdb_filename none")
	line("logfile_rotate 0")
	for _, l := range s.opts.ExtraConfig {
		line("%s", l)
	}
	conf := filepath.Join(s.dir, "squid.conf")
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	return conf, nil
}

// SetBasicAuth replaces the login the Squid demands from its next Start on
// (nil: none). A running Squid keeps the old one until it is restarted.
func (s *Squid) SetBasicAuth(login *Login) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.BasicAuth = login
}

// basicAuth is the current login, nil when Squid demands none.
func (s *Squid) basicAuth() *Login {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.BasicAuth
}

// writePasswordFile writes the htpasswd file, readable by the proxy user
// Squid's helper runs as.
func (s *Squid) writePasswordFile(a *Login) (string, error) {
	content := a.Htpasswd
	if content == "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(a.Password), bcrypt.MinCost)
		if err != nil {
			return "", err
		}
		content = a.Username + ":" + string(hash) + "\n"
	}
	path := filepath.Join(s.dir, "htpasswd")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

func (s *Squid) startOnce(deadline time.Time) error {
	conf, err := s.writeConfig()
	if err != nil {
		return err
	}
	// A killed Squid leaves its pid file; a recycled pid would make the next
	// start refuse with "Squid is already running".
	_ = os.Remove(filepath.Join(s.dir, "squid.pid"))
	logPath := filepath.Join(s.dir, "cache.log")
	var logOffset int64
	if fi, err := os.Stat(logPath); err == nil {
		logOffset = fi.Size()
	}
	out, err := os.OpenFile(filepath.Join(s.dir, "squid.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	bin := s.opts.Binary
	if bin == "" {
		bin = Binary
		if _, err := os.Stat(bin); err != nil {
			bin = "squid"
		}
	}
	service := ServiceName()
	cmd := exec.Command(bin, "-N", "-n", service, "-f", conf)
	cmd.Dir = s.dir
	cmd.Stdout = out
	cmd.Stderr = out
	// If the test binary dies, Squid must not outlive it holding the port.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start %s: %w", bin, err)
	}
	done := make(chan struct{})
	s.mu.Lock()
	s.cmd = cmd
	s.done = done
	s.exitErr = nil
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		out.Close()
		RemoveShm(service)
		s.mu.Lock()
		s.exitErr = err
		s.mu.Unlock()
		close(done)
	}()

	probe, err := newProbeTarget()
	if err != nil {
		_ = s.stop(syscall.SIGKILL, 5*time.Second)
		return err
	}
	defer probe.Close()
	var lastErr error
	for {
		select {
		case <-done:
			logText := testutil.ReadFrom(logPath, logOffset) + testutil.ReadFrom(filepath.Join(s.dir, "squid.out"), 0)
			if strings.Contains(logText, "Address already in use") {
				return errAddrInUse
			}
			return fmt.Errorf("squid exited during start: %v", s.exitError())
		default:
		}
		if lastErr = s.probe(probe); lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			_ = s.stop(syscall.SIGKILL, 5*time.Second)
			return fmt.Errorf("squid did not proxy a request within %s: %w", s.opts.StartTimeout, lastErr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Squid) exitError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitErr
}

// probe sends one GET through this Squid and checks that it was this Squid
// (its X-Cache names our unique hostname) and that the target saw our
// outgoing address, so a stranger on a reused port is never mistaken for us.
func (s *Squid) probe(p *probeTarget) error {
	proxyURL, _ := url.Parse(s.URL())
	if a := s.basicAuth(); a != nil {
		proxyURL.User = url.UserPassword(a.Username, a.Password)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	resp, err := c.Get(p.url)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe through squid: %s", resp.Status)
	}
	if xc := resp.Header.Get("X-Cache"); !strings.Contains(xc, s.hostname) {
		return fmt.Errorf("probe answered by another proxy: X-Cache %q, want %s", xc, s.hostname)
	}
	if got := string(bytes.TrimSpace(body)); got != s.OutgoingAddr() {
		return fmt.Errorf("probe target saw source %s, want %s", got, s.OutgoingAddr())
	}
	return nil
}

// stop signals Squid and waits for it to exit, escalating to SIGKILL after timeout.
func (s *Squid) stop(sig syscall.Signal, timeout time.Duration) error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if err := testutil.StopChild(cmd, done, sig, timeout); err != nil {
		return fmt.Errorf("squid %s: %w", s.opts.Name, err)
	}
	return nil
}

// probeTarget is a throwaway HTTP server that answers with the caller's source address.
type probeTarget struct {
	srv *http.Server
	url string
}

func newProbeTarget() (*probeTarget, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			w.Header().Set("Cache-Control", "no-store")
			fmt.Fprintln(w, host)
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	return &probeTarget{srv: srv, url: "http://" + ln.Addr().String() + "/testutil-probe"}, nil
}

func (p *probeTarget) Close() { _ = p.srv.Close() }
