package squid

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// ConfFiles is what a configuration under test runs with: squid.conf
// and any side files (an htpasswd file), written into a directory Squid can
// read after it drops to the proxy user.
type ConfFiles struct {
	// Conf is the squid.conf text.
	Conf string
	// Files are extra files by base name, written next to squid.conf.
	Files map[string]string
}

// StartConf runs real Squid in the foreground with a configuration the
// test does not control the rules of (a provider's generated squid.conf),
// for as long as the test runs. render gets the port Squid must listen on
// (on 127.0.0.1) and the directory its files land in, and returns them. It
// waits until the port accepts connections: the configuration's own access
// rules may refuse every request the way the Squid self-probe of Start
// would need, so nothing is proxied to check. A port taken between choosing
// and binding is replaced by another. It returns the listen address.
func StartConf(t testing.TB, name string, render func(port int, dir string) ConfFiles) string {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Fatal(squidMissing)
	}
	for attempt := 1; attempt <= 5; attempt++ {
		addr, err := testutil.FreeAddrOn("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		dir, err := squidDir(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		files := render(port, dir)
		for base, content := range files.Files {
			if err := os.WriteFile(filepath.Join(dir, base), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		conf := filepath.Join(dir, "squid.conf")
		if err := os.WriteFile(conf, []byte(files.Conf), 0o644); err != nil {
			t.Fatal(err)
		}
		var out testutil.LockedBuffer
		service := ServiceName()
		cmd := exec.Command(Binary, "-N", "-n", service, "-d", "1", "-f", conf)
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); RemoveShm(service); close(exited) }()
		stop := func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}
		if err := waitListening(addr, exited, 30*time.Second); err != nil {
			stop()
			if strings.Contains(out.String(), "Address already in use") {
				continue
			}
			t.Fatalf("squid %s: %v\n%s", name, err, out.String())
		}
		t.Cleanup(func() {
			stop()
			if t.Failed() {
				t.Logf("squid %s output:\n%s", name, out.String())
			}
		})
		return addr
	}
	t.Fatalf("squid %s found no free port in 5 attempts", name)
	return ""
}

// waitListening waits until addr accepts a connection, or the process exits.
func waitListening(addr string, exited <-chan struct{}, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		select {
		case <-exited:
			return fmt.Errorf("exited before listening on %s", addr)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			// A stranger that grabbed the port answers too, while Squid
			// exits failing to bind: give that a moment to show.
			select {
			case <-exited:
				return fmt.Errorf("exited after %s started accepting: the port is someone else's", addr)
			case <-time.After(300 * time.Millisecond):
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s within %s", addr, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
