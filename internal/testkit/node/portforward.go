package node

import (
	"fmt"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// forwarding is the line kubectl port-forward prints once it listens.
var forwarding = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> \d+`)

// portForwards numbers the port-forward processes of a test binary, so
// their logs do not overwrite one another.
var portForwards atomic.Int32

// PortForward runs `kubectl port-forward --address 127.0.0.1 TARGET
// :REMOTE` in namespace (TARGET as kubectl takes it: pod/NAME,
// deploy/NAME), as a person reaches a pod's loopback-only port, and
// returns the local address it listens on (a free port kubectl chose).
// The process runs until the test ends; a forward that does not start
// fails the test with kubectl's output.
func (c *Cluster) PortForward(t testing.TB, namespace, target string, remote int) string {
	t.Helper()
	name := fmt.Sprintf("port-forward-%d", portForwards.Add(1))
	p, err := startProc(c.logDir, name, filepath.Join(c.Bins, "kubectl"), "--kubeconfig", c.Kubeconfig,
		"-n", namespace, "port-forward", "--address", "127.0.0.1", target, fmt.Sprintf(":%d", remote))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.stop(5 * time.Second) })
	var addr string
	err = poll.Wait(time.Minute, "kubectl port-forward "+target+" to listen", func() error {
		if m := forwarding.FindStringSubmatch(p.tail(20)); m != nil {
			addr = "127.0.0.1:" + m[1]
			return nil
		}
		if done, _ := p.exited(); done {
			return nil
		}
		return fmt.Errorf("no %q line yet", "Forwarding from")
	})
	if err != nil || addr == "" {
		_, ended := p.exited()
		t.Fatalf("kubectl port-forward %s :%d: %v (ended: %v)\n%s", target, remote, err, ended, p.tail(20))
	}
	return addr
}
