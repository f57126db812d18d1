package testutil

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// TestMain doubles as the child process the process tests start: this test
// binary re-executed with TESTUTIL_CHILD_LISTEN set listens there, exits 0 on
// SIGTERM and prints any proxy variables it was given.
func TestMain(m *testing.M) {
	if addr := os.Getenv("TESTUTIL_CHILD_LISTEN"); addr != "" {
		helperChild(addr)
		return
	}
	os.Exit(m.Run())
}

func TestStartProcessWaitsForListenAndStopsWithSIGTERM(t *testing.T) {
	t.Setenv("HTTPS_PROXY", "http://127.0.0.1:1") // must not reach the child
	p, addrs := StartProcessOnFreePorts(t, os.Args[0], 1, func(addrs []string) ProcessOptions {
		return ProcessOptions{
			Name:            "child",
			Env:             []string{"TESTUTIL_CHILD_LISTEN=" + addrs[0]},
			WaitAddrs:       addrs,
			ExpectCleanExit: true,
		}
	})
	if err := WaitListening(addrs[0], 0); err != nil {
		t.Fatalf("start returned before %s accepted: %v", addrs[0], err)
	}
	poll.Until(t, 10*time.Second, "the child's readiness line", func() error {
		if !strings.Contains(p.Output(), "child ready") {
			return errors.New("child has not printed readiness")
		}
		return nil
	})
	if strings.Contains(p.Output(), "HTTPS_PROXY") {
		t.Fatalf("child saw the proxy environment:\n%s", p.Output())
	}
	code, err := p.Stop()
	if err != nil || code != 0 {
		t.Fatalf("stop: exit %d, %v", code, err)
	}
	if !strings.Contains(p.Output(), "child got terminated") {
		t.Fatalf("child did not see SIGTERM:\n%s", p.Output())
	}
}

func TestStartProcessRetriesWhenAPortIsTaken(t *testing.T) {
	t.Parallel()
	taken, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	holder := StartProcess(t, os.Args[0], ProcessOptions{
		Name: "holder", Env: []string{"TESTUTIL_CHILD_LISTEN=" + taken}, WaitAddrs: []string{taken},
	})
	_ = holder
	calls := 0
	_, addrs := StartProcessOnFreePorts(t, os.Args[0], 1, func(addrs []string) ProcessOptions {
		calls++
		if calls == 1 {
			addrs[0] = taken // simulate losing the race for the port
		}
		return ProcessOptions{
			Name: "retrier", Env: []string{"TESTUTIL_CHILD_LISTEN=" + addrs[0]}, WaitAddrs: addrs,
		}
	})
	if calls != 2 || addrs[0] == taken {
		t.Fatalf("calls %d, addr %s: want a second attempt on another port than %s", calls, addrs[0], taken)
	}
}

func TestCleanEnvDropsProxySettings(t *testing.T) {
	t.Setenv("http_proxy", "http://127.0.0.1:1")
	t.Setenv("PROXYFLEET_LISTEN", "127.0.0.1:1")
	t.Setenv("TESTUTIL_KEEP", "yes")
	env := strings.Join(cleanEnv(), "\n")
	if strings.Contains(env, "http_proxy=") || strings.Contains(env, "PROXYFLEET_") {
		t.Fatalf("proxy settings leaked: %s", env)
	}
	if !strings.Contains(env, "TESTUTIL_KEEP=yes") {
		t.Fatal("ordinary variables were dropped")
	}
}

func TestProcessStopReportsExitCodeOfACrashedChild(t *testing.T) {
	t.Parallel()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p := StartProcess(t, os.Args[0], ProcessOptions{
		Name: "victim", Env: []string{"TESTUTIL_CHILD_LISTEN=" + addr}, WaitAddrs: []string{addr},
	})
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(10 * time.Second)
	if err != nil || code != -1 || !p.Exited() {
		t.Fatalf("exit %d, %v: want -1 (killed)", code, err)
	}
}
