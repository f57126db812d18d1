package redis

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// redisCmd sends one inline command and returns the first reply line.
func redisCmd(t *testing.T, addr, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\r\n", cmd); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(line, "$") && !strings.HasPrefix(line, "$-1") {
		if line, err = br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	return strings.TrimSpace(line)
}

func TestRedisKeepsWritesAcrossAKillOnItsAOF(t *testing.T) {
	t.Parallel()
	r := Start(t, Options{})
	if r.Addr() == "127.0.0.1:6379" {
		t.Fatalf("test redis on the system port %s", r.Addr())
	}
	if got := redisCmd(t, r.Addr(), "SET k v1"); got != "+OK" {
		t.Fatalf("SET answered %q", got)
	}
	addr, pid := r.Addr(), r.PID()
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if r.PID() != 0 {
		t.Fatal("PID non-zero after Kill")
	}
	r.Start()
	if r.Addr() != addr || r.PID() == pid || r.PID() == 0 {
		t.Fatalf("restart: addr %s pid %d, want addr %s and a new pid", r.Addr(), r.PID(), addr)
	}
	if got := redisCmd(t, r.Addr(), "GET k"); got != "v1" {
		t.Fatalf("after SIGKILL and restart GET k = %q, want v1 from the AOF", got)
	}
}

func TestRedisWithPasswordRefusesUnauthenticatedClients(t *testing.T) {
	t.Parallel()
	r := Start(t, Options{Password: "s3cret"})
	if got := redisCmd(t, r.Addr(), "PING"); !strings.HasPrefix(got, "-NOAUTH") {
		t.Fatalf("PING without AUTH answered %q, want -NOAUTH", got)
	}
	if !strings.Contains(r.URL(), ":s3cret@") {
		t.Fatalf("URL %q carries no password", r.URL())
	}
}

func TestRedisTLSRefusesPlaintextAndAnswersItsCA(t *testing.T) {
	t.Parallel()
	ca := NewCA(t, "redis-test-ca")
	r := Start(t, Options{TLS: &TLS{CA: ca, Server: ca.Issue(t, "server"), Client: ca.Issue(t, "client"), AuthClients: true}})
	if got, err := r.Do("PING"); err != nil || got != "PONG" {
		t.Fatalf("PING over TLS: %v %v", got, err)
	}
	if !strings.HasPrefix(r.URL(), "rediss://") {
		t.Fatalf("URL %q is not rediss://", r.URL())
	}
	c, err := net.DialTimeout("tcp", r.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write([]byte("PING\r\n"))
	if line, err := bufio.NewReader(c).ReadString('\n'); err == nil && strings.Contains(line, "PONG") {
		t.Fatalf("the TLS port answered plaintext PING: %q", line)
	}
}

func TestRedisSentinelFailsOverToTheReplica(t *testing.T) {
	t.Parallel()
	rs := StartSentinel(t, SentinelTopology{Password: "s3cret"})
	old := rs.Primary(t)
	if old != rs.Nodes[0] {
		t.Fatalf("primary %s, want the first node %s", old.Addr(), rs.Nodes[0].Addr())
	}
	if !strings.HasPrefix(rs.URL(), "redis+sentinel://:s3cret@") || !strings.HasSuffix(rs.URL(), "/leases") {
		t.Fatalf("URL %q", rs.URL())
	}
	if err := old.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	now := rs.WaitFailover(t, old, 60*time.Second)
	t.Logf("failover to %s in %s", now.Addr(), time.Since(start).Round(time.Millisecond))
}

func TestRedisClusterServesEverySlotAndFailsOver(t *testing.T) {
	t.Parallel()
	rc := StartCluster(t, ClusterTopology{})
	if len(rc.Nodes) != 6 {
		t.Fatalf("%d nodes, want 6", len(rc.Nodes))
	}
	p := rc.PrimaryForKey(t, "{fleet}:x")
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	now := rc.WaitFailover(t, "{fleet}:x", p, 60*time.Second)
	if now == p {
		t.Fatal("no new primary")
	}
	t.Logf("cluster failover in %s", time.Since(start).Round(time.Millisecond))
}
