package testutil

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// maxCapturedOutput bounds how much of a child's output a Process keeps (the tail).
const maxCapturedOutput = 256 << 10

// BuildBinary returns the proxyfleet binary to test: $PROXYFLEET_BIN when set
// (make e2e and make unit pass make build's), else a fresh
// `go build ./cmd/proxyfleet` into a temp dir, static and -trimpath as make
// build's is, so Go's build cache already holds its packages: under make
// unit's CGO_ENABLED=1 (the race detector's) it would otherwise compile the
// whole product again with cgo, which took a loaded run's charts test past
// its 10 minutes.
func BuildBinary(t testing.TB) string {
	t.Helper()
	return buildBinary(t, "PROXYFLEET_BIN")
}

// BuildSidecarBinary is BuildBinary for the lean sidecar build (-tags
// sidecar,nomirror: make sidecar's bin/proxyfleet-sidecar, the sidecar
// image's entrypoint): $PROXYFLEET_SIDECAR_BIN when set.
func BuildSidecarBinary(t testing.TB) string {
	t.Helper()
	return buildBinary(t, "PROXYFLEET_SIDECAR_BIN", "-tags", "sidecar,nomirror")
}

// BuildSidecarMITMBinary is BuildBinary for the sidecar build with MITM
// mirroring (-tags sidecar: bin/proxyfleet-sidecar-mitm, what the webhook
// runs for MITM pods): $PROXYFLEET_SIDECAR_MITM_BIN when set.
func BuildSidecarMITMBinary(t testing.TB) string {
	t.Helper()
	return buildBinary(t, "PROXYFLEET_SIDECAR_MITM_BIN", "-tags", "sidecar")
}

func buildBinary(t testing.TB, env string, flags ...string) string {
	t.Helper()
	if bin := os.Getenv(env); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("%s=%s: %v", env, bin, err)
		}
		return bin
	}
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "proxyfleet")
	args := append(append([]string{"build", "-trimpath"}, flags...), "-o", out, "./cmd/proxyfleet")
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %v: %v\n%s", args, err, msg)
	}
	return out
}

// ModuleRoot finds the directory holding go.mod, walking up from the working directory.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// ProcessOptions describes a child process to start.
type ProcessOptions struct {
	// Name labels the process in logs (default: the binary's base name).
	Name string
	// Args are the command-line arguments after the binary.
	Args []string
	// Env is added to a clean copy of our environment, from which
	// HTTP(S)_PROXY, NO_PROXY (any case) and PROXYFLEET_* are removed so the
	// child sees only what the test sets.
	Env []string
	// WaitAddrs must all accept TCP connections before the start returns.
	WaitAddrs []string
	// StartTimeout bounds the wait for WaitAddrs (default 30s).
	StartTimeout time.Duration
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL (default 20s).
	StopTimeout time.Duration
	// ExpectCleanExit makes test cleanup fail the test unless the process,
	// stopped with SIGTERM there, exits 0.
	ExpectCleanExit bool
}

// Process is a running child whose stdout and stderr are captured (the tail)
// and written to the test log at cleanup.
type Process struct {
	opts ProcessOptions
	cmd  *exec.Cmd
	out  *TailBuffer
	done chan struct{}

	mu      sync.Mutex
	exitErr error
}

// StartProcess starts bin, waits until opts.WaitAddrs accept connections, and
// at cleanup stops it with SIGTERM and logs its output.
func StartProcess(t testing.TB, bin string, opts ProcessOptions) *Process {
	t.Helper()
	p, err := LaunchProcess(bin, opts)
	if err != nil {
		t.Fatal(err)
	}
	registerProcessCleanup(t, p)
	return p
}

// StartProcessOnFreePorts picks n free 127.0.0.1 addresses, builds the
// options from them, and starts the process; if it exits during start
// saying "address already in use" (a port was taken meanwhile) it tries
// again with new addresses. It returns the process and the addresses used.
func StartProcessOnFreePorts(t testing.TB, bin string, n int, build func(addrs []string) ProcessOptions) (*Process, []string) {
	t.Helper()
	p, addrs, err := LaunchProcessOnFreePorts(bin, n, build)
	if err != nil {
		t.Fatal(err)
	}
	registerProcessCleanup(t, p)
	return p, addrs
}

func registerProcessCleanup(t testing.TB, p *Process) {
	t.Cleanup(func() {
		if !p.Exited() {
			code, err := p.Stop()
			if err != nil {
				t.Errorf("%s: %v", p.opts.Name, err)
			} else if p.opts.ExpectCleanExit && code != 0 {
				t.Errorf("%s exited %d after SIGTERM, want 0", p.opts.Name, code)
			}
		}
		t.Logf("%s output:\n%s", p.opts.Name, p.Output())
	})
}

// LaunchProcessOnFreePorts is StartProcessOnFreePorts outside a test; the
// caller must Stop the process.
func LaunchProcessOnFreePorts(bin string, n int, build func(addrs []string) ProcessOptions) (*Process, []string, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		addrs := make([]string, n)
		for i := range addrs {
			a, err := FreeAddr()
			if err != nil {
				return nil, nil, err
			}
			addrs[i] = a
		}
		p, err := LaunchProcess(bin, build(addrs))
		if err == nil {
			return p, addrs, nil
		}
		lastErr = err
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	return nil, nil, lastErr
}

// LaunchProcess is StartProcess outside a test; the caller must Stop the process.
func LaunchProcess(bin string, opts ProcessOptions) (*Process, error) {
	if opts.Name == "" {
		opts.Name = filepath.Base(bin)
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = 20 * time.Second
	}
	p := &Process{opts: opts, out: NewTailBuffer(maxCapturedOutput), done: make(chan struct{})}
	cmd := exec.Command(bin, opts.Args...)
	cmd.Env = append(cleanEnv(), opts.Env...)
	cmd.Stdout = p.out
	cmd.Stderr = p.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", opts.Name, err)
	}
	p.cmd = cmd
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	deadline := time.Now().Add(opts.StartTimeout)
	for _, addr := range opts.WaitAddrs {
		err := p.waitListening(addr, deadline)
		if err == nil {
			continue
		}
		if !p.Exited() {
			_, _ = p.Stop()
		}
		out := p.Output()
		if strings.Contains(strings.ToLower(out), "address already in use") {
			return nil, fmt.Errorf("%s: %w\n%s", opts.Name, errAddrInUse, out)
		}
		return nil, fmt.Errorf("%s did not listen on %s (%v, exit: %v)\n%s", opts.Name, addr, err, p.ExitErr(), out)
	}
	return p, nil
}

// waitListening polls addr until it accepts, the child exits, or deadline.
func (p *Process) waitListening(addr string, deadline time.Time) error {
	for {
		if p.Exited() {
			return errExited
		}
		err := WaitListening(addr, 0)
		if err == nil {
			// Something accepts; make sure it is our child and not a
			// stranger that holds the port while our child fails to bind.
			var mine bool
			if mine, err = listensOn(p.cmd.Process.Pid, addr); err == nil && mine {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("%s accepts connections but not from pid %d", addr, p.cmd.Process.Pid)
			}
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(poll.DefaultInterval)
	}
}

// errExited stops a start poll once the child has died.
var errExited = errors.New("process exited")

// cleanEnv is our environment without proxy settings and PROXYFLEET_* config.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch uk := strings.ToUpper(k); {
		case uk == "HTTP_PROXY", uk == "HTTPS_PROXY", uk == "NO_PROXY", uk == "ALL_PROXY",
			strings.HasPrefix(uk, "PROXYFLEET_"):
			continue
		}
		env = append(env, kv)
	}
	return env
}

// PID is the child's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Output is the captured tail of stdout and stderr so far.
func (p *Process) Output() string { return p.out.String() }

// Exited reports whether the child has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitErr is the error cmd.Wait returned (nil while running or after exit 0).
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// Signal sends sig to the child.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Wait waits up to timeout for the child to exit and returns its exit code
// (-1 when killed by a signal).
func (p *Process) Wait(timeout time.Duration) (int, error) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return 0, fmt.Errorf("%s still running after %s", p.opts.Name, timeout)
	}
}

// Stop sends SIGTERM and waits StopTimeout for the exit; then SIGKILL and an
// error. It returns the exit code.
func (p *Process) Stop() (int, error) {
	if p.Exited() {
		return p.cmd.ProcessState.ExitCode(), nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	code, err := p.Wait(p.opts.StopTimeout)
	if err == nil {
		return code, nil
	}
	_ = p.cmd.Process.Kill()
	code, _ = p.Wait(10 * time.Second)
	return code, fmt.Errorf("%s did not exit within %s of SIGTERM; killed", p.opts.Name, p.opts.StopTimeout)
}
