//go:build linux

package gateway

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
)

// fdChildEnv marks the re-executed test binary that runs with its
// descriptors used up, so no other test shares the lowered limit.
const fdChildEnv = "PROXYFLEET_TEST_OUT_OF_DESCRIPTORS"

// TestOutOfDescriptorsIsTheGatewaysOwn503: a gateway whose own dial finds
// no descriptor answers 503 gateway_overloaded, and its one member stays in
// service (were it blamed, the next request would be 503 no_member for the
// failure cooldown). Run in a child process: the descriptors are really
// used up there, with the kernel's EMFILE, not a fake.
func TestOutOfDescriptorsIsTheGatewaysOwn503(t *testing.T) {
	if os.Getenv(fdChildEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestOutOfDescriptorsIsTheGatewaysOwn503$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), fdChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestOutOfDescriptorsIsTheGatewaysOwn503") {
			t.Fatalf("the child with its descriptors used up: %v\n%s", err, out)
		}
		return
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = min(lim.Max, 512)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		member func(t *testing.T) pool.Member
	}{
		{"a direct member", func(*testing.T) pool.Member { return directMembers(1)[0] }},
		{"a proxy member", tunnellingUpstream},
	} {
		t.Run(tc.name, func(t *testing.T) { overloadedOnce(t, tc.member(t)) })
	}
}

// tunnellingUpstream is a CONNECT proxy member.
func tunnellingUpstream(t *testing.T) pool.Member { return relayingUpstream(t, "p1") }

// overloadedOnce: with every descriptor but two used up, a CONNECT through
// member is 503 gateway_overloaded; with them free again, the next one goes
// through the same member.
func overloadedOnce(t *testing.T, member pool.Member) {
	// No parking: the parker's epoll descriptor, made on the first park,
	// would take one of the few left.
	e := newEnv(t, Options{AllowPrivateTargets: true, TunnelIdleAfter: time.Hour}, pool.StoreOptions{}, member)
	target := echoTarget(t)
	// One tunnel through first, kept open, so everything a tunnel sets up
	// once (the netpoller, pooled pipes) holds its descriptors already.
	warm, resp, err := testutil.ConnectTunnel(e.addr, target, nil, 20*time.Second)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	defer warm.Close()
	if err := echoOnce(warm, []byte("warm")); err != nil {
		t.Fatal(err)
	}
	// Use up every descriptor but two: the client's socket and the one
	// the gateway accepts. The gateway's dial (to the member, or for a
	// direct member to the site) finds none.
	var junk []*os.File
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		junk = append(junk, f)
	}
	if len(junk) < 2 {
		t.Fatalf("only %d descriptors could be opened under the limit", len(junk))
	}
	for _, f := range junk[len(junk)-2:] {
		f.Close()
	}
	junk = junk[:len(junk)-2]
	c, resp, err := testutil.ConnectTunnel(e.addr, target, nil, 20*time.Second)
	if c != nil {
		c.Close()
	}
	for _, f := range junk {
		f.Close()
	}
	if err != nil {
		t.Fatalf("CONNECT with the descriptors used up: %v", err)
	}
	if resp.StatusCode != 503 || resp.Header.Get(HeaderReason) != fault.ReasonOverloaded || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("CONNECT with the descriptors used up: %d %q, want 503 %s with Retry-After", resp.StatusCode, resp.Header.Get(HeaderReason), fault.ReasonOverloaded)
	}
	// The member was not blamed: the next tunnel goes through it.
	poll.Until(t, 20*time.Second, "a tunnel through the one member once descriptors are free", func() error {
		c, resp, err := testutil.ConnectTunnel(e.addr, target, nil, 20*time.Second)
		if err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			t.Fatalf("after the overload: %d %q (the member was blamed for the gateway's own failure)", resp.StatusCode, resp.Header.Get(HeaderReason))
		}
		defer c.Close()
		return echoOnce(c, []byte("after"))
	})
}
