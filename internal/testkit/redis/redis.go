// Package redis runs real redis-server (Debian's) for a test: one server
// (Start, Launch) with its AOF, a password or TLS from a test CA (NewCA),
// kept on its port across Stop/Kill and Start; and the two topologies a
// shared lease store is run on, a Sentinel-managed primary with replicas
// (StartSentinel) and a Redis Cluster (StartCluster), with the waits their
// failovers need. Its own checks (PING, INFO, Do) speak RESP themselves.
//
// It imports internal/testutil and internal/testutil/poll and nothing else
// of ours: no Redis client library and no lease store code (the store's
// tests bring those), and no other launcher in internal/testkit.
package redis

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// redisMissing is the failure message when redis-server is absent: the
// suites never skip.
const redisMissing = "redis-server not installed: run make test as root (hack/install-deps.sh apt-installs it) or apt-get install redis-server"

// Options configures one redis-server instance.
type Options struct {
	// Password turns on requirepass (the default user's password).
	Password string
	// AppendFsync is the AOF's appendfsync (default "always", so that a
	// SIGKILL loses nothing a test acquired; production would say everysec).
	AppendFsync string
	// StartTimeout bounds how long a start waits for PONG (default 30s).
	StartTimeout time.Duration
	// TLS serves TLS only (the plaintext port is off) with a certificate
	// of a test CA.
	TLS *TLS
	// ReplicaOf makes the server a replica of this host:port (masterauth is
	// Password: every node of a test topology shares one).
	ReplicaOf string
	// Cluster turns on cluster mode (its nodes.conf in the data dir) with
	// ClusterNodeTimeout (default 1s) as the time before a silent primary
	// is failed over.
	Cluster            bool
	ClusterNodeTimeout time.Duration
	// Sentinel runs redis-server --sentinel (no data, no AOF) monitoring a
	// primary instead of a data server.
	Sentinel *SentinelOf
}

// TLS is the TLS of a test redis-server.
type TLS struct {
	CA *CA
	// Server is the server's certificate (CA.Issue).
	Server CertFiles
	// Client is presented by the launcher's own readiness checks; with
	// AuthClients every client must present one signed by CA.
	Client      CertFiles
	AuthClients bool
}

// SentinelOf is what one Sentinel monitors.
type SentinelOf struct {
	MasterName string
	// Master is the primary's host:port.
	Master string
	// Quorum is how many Sentinels must agree the primary is down (default 2).
	Quorum int
	// DownAfter is how long a silent primary takes to be judged down
	// (default 1s); FailoverTimeout bounds one failover attempt (default 5s).
	DownAfter, FailoverTimeout time.Duration
	// AuthPass is the data nodes' password.
	AuthPass string
}

// Server is one Debian redis-server run in the foreground as a child
// process, on 127.0.0.1 with its data directory (and AOF) in a temp dir. The
// port is chosen free at the first start and kept across Stop/Kill and
// Start, so a restarted server is the same server to its clients and
// reloads what its AOF kept. It never touches the system instance.
type Server struct {
	opts Options
	dir  string
	bin  string

	mu   sync.Mutex
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a redis-server for the test and stops it, and removes
// its directory, at cleanup; on failure the tail of its log is in the test
// log. A missing redis-server fails the test (never skips).
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	r, err := Launch(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("redis-server %s log tail:\n%s", r.Addr(), r.LogTail(4096))
		}
		if err := r.Close(); err != nil {
			t.Errorf("redis-server: %v", err)
		}
	})
	return r
}

// Launch starts a redis-server outside a test (e2e/bench); the caller
// must Close it.
func Launch(opts Options) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if _, serr := os.Stat("/usr/bin/redis-server"); serr != nil {
			return nil, errors.New(redisMissing)
		}
		bin = "/usr/bin/redis-server"
	}
	if opts.AppendFsync == "" {
		opts.AppendFsync = "always"
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if opts.ClusterNodeTimeout <= 0 {
		opts.ClusterNodeTimeout = time.Second
	}
	if sn := opts.Sentinel; sn != nil {
		if sn.Quorum <= 0 {
			sn.Quorum = 2
		}
		if sn.DownAfter <= 0 {
			sn.DownAfter = time.Second
		}
		if sn.FailoverTimeout <= 0 {
			sn.FailoverTimeout = 5 * time.Second
		}
	}
	dir, err := os.MkdirTemp("", "pfredis-")
	if err != nil {
		return nil, err
	}
	r := &Server{opts: opts, dir: dir, bin: bin, done: closedChan()}
	if err := r.start(false); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Addr is host:port of the server.
func (r *Server) Addr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port))
}

// URL is the redis:// URL of database 0 (rediss:// with TLS), with the
// password when one is set.
func (r *Server) URL() string {
	scheme := "redis://"
	if r.opts.TLS != nil {
		scheme = "rediss://"
	}
	if r.opts.Password != "" {
		return scheme + ":" + r.opts.Password + "@" + r.Addr() + "/0"
	}
	return scheme + r.Addr() + "/0"
}

// Dir is the server's data directory (AOF, log).
func (r *Server) Dir() string { return r.dir }

// PID is the running server's process id, 0 when stopped.
func (r *Server) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.exited() {
		return 0
	}
	return r.cmd.Process.Pid
}

func (r *Server) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// Start starts a stopped server again on the same port and waits until it
// answers PING (its AOF loaded). It panics on failure: tests call it where
// a failure is fatal anyway.
func (r *Server) Start() {
	if err := r.start(true); err != nil {
		panic(err)
	}
}

// Stop shuts the server down with SIGTERM (it fsyncs the AOF) and waits.
func (r *Server) Stop() error { return r.stop(syscall.SIGTERM) }

// Kill ends the server with SIGKILL: only what the AOF already holds survives.
func (r *Server) Kill() error { return r.stop(syscall.SIGKILL) }

// Close stops the server and removes its directory.
func (r *Server) Close() error {
	err := r.stop(syscall.SIGTERM)
	if rmErr := os.RemoveAll(r.dir); rmErr != nil && err == nil {
		err = rmErr
	}
	return err
}

// LogTail returns the last n bytes of the server's log.
func (r *Server) LogTail(n int64) string {
	return tailOf(filepath.Join(r.dir, "redis.log"), n)
}

func tailOf(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "(log: " + err.Error() + ")"
	}
	return testutil.ReadFrom(path, max(st.Size()-n, 0))
}

func (r *Server) stop(sig syscall.Signal) error {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if err := testutil.StopChild(cmd, done, sig, 30*time.Second); err != nil {
		return fmt.Errorf("redis-server on %s: %w", r.Addr(), err)
	}
	return nil
}

// start runs the server; samePort keeps the port (a restart: a port still
// held by the dying server is retried until the deadline), otherwise a
// free port is picked and, should another process take it first, another.
func (r *Server) start(samePort bool) error {
	deadline := time.Now().Add(r.opts.StartTimeout)
	var last error
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		if !samePort {
			addr, err := testutil.FreeAddr()
			if err != nil {
				return err
			}
			_, p, _ := net.SplitHostPort(addr)
			r.mu.Lock()
			r.port, _ = strconv.Atoi(p)
			r.mu.Unlock()
		}
		last = r.startOnce(deadline)
		if last == nil {
			return nil
		}
		if !strings.Contains(last.Error(), "in use") {
			return last
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("redis-server did not start before the deadline: %w", last)
}

func (r *Server) startOnce(deadline time.Time) error {
	logPath := filepath.Join(r.dir, "redis.log")
	st, _ := os.Stat(logPath)
	var logStart int64
	if st != nil {
		logStart = st.Size()
	}
	args, err := r.args(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.bin, args...)
	cmd.Dir = r.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
	addr := r.Addr()
	for time.Now().Before(deadline) {
		select {
		case <-done:
			out := testutil.ReadFrom(logPath, logStart)
			if strings.Contains(out, "Address already in use") {
				return fmt.Errorf("redis-server: port %s in use", addr)
			}
			return fmt.Errorf("redis-server on %s exited at start: %s", addr, out)
		default:
		}
		if err := r.ping(addr); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-done
	return fmt.Errorf("redis-server on %s did not answer PING in time; log: %s", addr, testutil.ReadFrom(logPath, logStart))
}

// args are the server's command line.
func (r *Server) args(logPath string) ([]string, error) {
	o := r.opts
	common := []string{"--bind", "127.0.0.1", "--dir", r.dir, "--logfile", logPath, "--daemonize", "no", "--protected-mode", "yes"}
	if sn := o.Sentinel; sn != nil {
		// A Sentinel needs a config file of its own, which it rewrites; a
		// restart keeps what it learnt (the current primary, its peers).
		conf := filepath.Join(r.dir, "sentinel.conf")
		if _, err := os.Stat(conf); err != nil {
			host, port, err := net.SplitHostPort(sn.Master)
			if err != nil {
				return nil, err
			}
			text := fmt.Sprintf("sentinel monitor %s %s %s %d\n", sn.MasterName, host, port, sn.Quorum) +
				fmt.Sprintf("sentinel down-after-milliseconds %s %d\n", sn.MasterName, sn.DownAfter.Milliseconds()) +
				fmt.Sprintf("sentinel failover-timeout %s %d\n", sn.MasterName, sn.FailoverTimeout.Milliseconds()) +
				fmt.Sprintf("sentinel parallel-syncs %s 1\n", sn.MasterName)
			if sn.AuthPass != "" {
				text += fmt.Sprintf("sentinel auth-pass %s %s\n", sn.MasterName, sn.AuthPass)
			}
			if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
				return nil, err
			}
		}
		return append([]string{conf, "--sentinel", "--port", strconv.Itoa(r.port)}, common...), nil
	}
	args := append(common,
		"--appendonly", "yes",
		"--appendfsync", o.AppendFsync,
		"--save", "",
		// A replica syncs at once, not after the default 5s wait for more.
		"--repl-diskless-sync-delay", "0",
	)
	if tl := o.TLS; tl != nil {
		auth := "no"
		if tl.AuthClients {
			auth = "yes"
		}
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(r.port),
			"--tls-cert-file", tl.Server.CertFile, "--tls-key-file", tl.Server.KeyFile,
			"--tls-ca-cert-file", tl.CA.CertFile, "--tls-auth-clients", auth, "--tls-replication", "yes")
	} else {
		args = append(args, "--port", strconv.Itoa(r.port))
	}
	if o.Password != "" {
		args = append(args, "--requirepass", o.Password, "--masterauth", o.Password)
	}
	if o.ReplicaOf != "" {
		host, port, err := net.SplitHostPort(o.ReplicaOf)
		if err != nil {
			return nil, err
		}
		args = append(args, "--replicaof", host, port)
	}
	if o.Cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(o.ClusterNodeTimeout.Milliseconds(), 10))
	}
	return args, nil
}

// dial connects to addr as a client of this server (TLS when it serves it).
func (r *Server) dial(addr string) (net.Conn, error) {
	if tl := r.opts.TLS; tl != nil {
		conf, err := tl.CA.clientTLS(tl.Client)
		if err != nil {
			return nil, err
		}
		return tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, conf)
	}
	return net.DialTimeout("tcp", addr, time.Second)
}

// ping sends PING (with AUTH first when a password is set) and wants PONG
// from a server whose dir is ours; a server still loading its AOF answers
// -LOADING, which is not ready.
func (r *Server) ping(addr string) error {
	c, err := r.dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	br := bufio.NewReader(c)
	if r.opts.Password != "" {
		if _, err := fmt.Fprintf(c, "AUTH %s\r\n", r.opts.Password); err != nil {
			return err
		}
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
			return fmt.Errorf("AUTH: %q %v", line, err)
		}
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := br.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	// A stranger that took the port between FreeAddr and our bind would
	// answer PING too; only our server has our directory (a Sentinel: our
	// config file).
	if r.opts.Sentinel != nil {
		if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
			return err
		}
		if line, err = br.ReadString('\n'); err != nil {
			return err
		}
		n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil {
			return fmt.Errorf("INFO answered %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return err
		}
		if want := "config_file:" + filepath.Join(r.dir, "sentinel.conf"); !strings.Contains(string(buf), want) {
			return fmt.Errorf("a Sentinel answers on %s, not ours", addr)
		}
		return nil
	}
	if _, err := c.Write([]byte("CONFIG GET dir\r\n")); err != nil {
		return err
	}
	for range 5 { // *2, $3, dir, $N, <dir>
		if line, err = br.ReadString('\n'); err != nil {
			return err
		}
	}
	if got := strings.TrimSpace(line); got != r.dir {
		return fmt.Errorf("a redis-server with dir %q answers on %s, not ours", got, addr)
	}
	return nil
}
