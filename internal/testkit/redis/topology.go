package redis

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// Do sends one command to the server and returns its reply: a string, an
// int64, nil, a []any, or an error for an error reply. It authenticates
// first when the server has a password (a Sentinel is asked without).
func (r *Server) Do(args ...string) (any, error) {
	c, err := r.dial(r.Addr())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	if r.opts.Password != "" && r.opts.Sentinel == nil {
		if _, err := c.Write(respCommand("AUTH", r.opts.Password)); err != nil {
			return nil, err
		}
		if v, err := readRESP(br); err != nil {
			return nil, err
		} else if e, ok := v.(error); ok {
			return nil, e
		}
	}
	if _, err := c.Write(respCommand(args...)); err != nil {
		return nil, err
	}
	v, err := readRESP(br)
	if err != nil {
		return nil, err
	}
	if e, ok := v.(error); ok {
		return nil, e
	}
	return v, nil
}

// Info is one INFO section as key -> value.
func (r *Server) Info(section string) (map[string]string, error) {
	v, err := r.Do("INFO", section)
	if err != nil {
		return nil, err
	}
	s, _ := v.(string)
	out := map[string]string{}
	for line := range strings.SplitSeq(s, "\n") {
		if k, val, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = val
		}
	}
	return out, nil
}

func respCommand(args ...string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return []byte(b.String())
}

func readRESP(br *bufio.Reader) (any, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty RESP line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return errors.New(line[1:]), nil
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readRESP(br); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected RESP line %q", line)
}

// launchRedisNodes starts n servers at once (a topology's nodes), each
// with the options opt(i) gives; on failure it closes those that started.
func launchRedisNodes(n int, opt func(i int) Options) ([]*Server, error) {
	nodes := make([]*Server, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			nodes[i], errs[i] = Launch(opt(i))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeNodes(nodes)
		return nil, err
	}
	return nodes, nil
}

func closeNodes(nodes []*Server) error {
	var errs []error
	for _, r := range nodes {
		if r != nil {
			errs = append(errs, r.Close())
		}
	}
	return errors.Join(errs...)
}

// cleanupTopology closes nodes at t's cleanup, logging their log tails
// when t failed.
func cleanupTopology(t testing.TB, what string, nodes []*Server) {
	t.Cleanup(func() {
		if t.Failed() {
			for i, r := range nodes {
				t.Logf("%s node %d (%s) log tail:\n%s", what, i, r.Addr(), r.LogTail(4096))
			}
		}
		if err := closeNodes(nodes); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
}

// SentinelTopology configures StartSentinel.
type SentinelTopology struct {
	// MasterName is the Sentinel master name (default "leases").
	MasterName string
	// Replicas is how many replicas the primary has (default 1), Sentinels
	// how many Sentinels watch it (default 3, quorum 2).
	Replicas, Sentinels int
	// Password is every data node's requirepass and masterauth.
	Password string
	// DownAfter is Sentinel's down-after-milliseconds (default 1s).
	DownAfter time.Duration
}

// Sentinel is a Sentinel-managed primary with replicas and its
// Sentinels, every one a real redis-server on a free loopback port.
type Sentinel struct {
	MasterName string
	// Nodes are the data nodes: Nodes[0] was the primary at start.
	Nodes     []*Server
	Sentinels []*Server
	password  string
}

// StartSentinel starts the topology for the test (closed at cleanup)
// and waits until every Sentinel knows the primary, its replicas and the
// other Sentinels (so a failover can be agreed), and the replicas are in
// sync.
func StartSentinel(t testing.TB, o SentinelTopology) *Sentinel {
	t.Helper()
	rs, err := LaunchSentinel(o)
	if err != nil {
		t.Fatal(err)
	}
	cleanupTopology(t, "sentinel topology", append(slices.Clone(rs.Nodes), rs.Sentinels...))
	return rs
}

// LaunchSentinel is StartSentinel outside a test; the caller
// must Close it.
func LaunchSentinel(o SentinelTopology) (*Sentinel, error) {
	if o.MasterName == "" {
		o.MasterName = "leases"
	}
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.Sentinels <= 0 {
		o.Sentinels = 3
	}
	nodes, err := launchRedisNodes(1, func(int) Options { return Options{Password: o.Password, AppendFsync: "everysec"} })
	if err != nil {
		return nil, err
	}
	primary := nodes[0]
	rs := &Sentinel{MasterName: o.MasterName, Nodes: nodes, password: o.Password}
	replicas, err := launchRedisNodes(o.Replicas, func(int) Options {
		return Options{Password: o.Password, AppendFsync: "everysec", ReplicaOf: primary.Addr()}
	})
	if err != nil {
		rs.Close()
		return nil, err
	}
	rs.Nodes = append(rs.Nodes, replicas...)
	if err := waitReplicasSynced(replicas); err != nil {
		rs.Close()
		return nil, err
	}
	if rs.Sentinels, err = launchRedisNodes(o.Sentinels, func(int) Options {
		return Options{Sentinel: &SentinelOf{MasterName: o.MasterName, Master: primary.Addr(), DownAfter: o.DownAfter, AuthPass: o.Password}}
	}); err != nil {
		rs.Close()
		return nil, err
	}
	if err := rs.waitAgreed(primary.Addr(), 60*time.Second); err != nil {
		rs.Close()
		return nil, err
	}
	return rs, nil
}

// Close stops every node and Sentinel and removes their directories.
func (rs *Sentinel) Close() error {
	return closeNodes(append(slices.Clone(rs.Nodes), rs.Sentinels...))
}

// waitReplicasSynced waits until every replica among nodes has its link to
// its primary up (a replica that never synced cannot be promoted).
func waitReplicasSynced(nodes []*Server) error {
	return poll.Wait(30*time.Second, "every replica's link to its primary", func() error {
		for _, r := range nodes {
			info, err := r.Info("replication")
			if err != nil {
				return err
			}
			if info["role"] == "slave" && info["master_link_status"] != "up" {
				return fmt.Errorf("replica %s: master link %q", r.Addr(), info["master_link_status"])
			}
		}
		return nil
	})
}

// waitAgreed waits until every Sentinel names master as the primary and
// sees every other data node as a replica and every other Sentinel.
func (rs *Sentinel) waitAgreed(master string, timeout time.Duration) error {
	return poll.Wait(timeout, "the Sentinels to agree on "+master, func() error {
		for _, s := range rs.Sentinels {
			if got, err := rs.masterOf(s); err != nil || got != master {
				return fmt.Errorf("sentinel %s names %q as primary (%v), want %s", s.Addr(), got, err, master)
			}
			for _, q := range []struct {
				cmd  string
				want int
			}{{"replicas", len(rs.Nodes) - 1}, {"sentinels", len(rs.Sentinels) - 1}} {
				v, err := s.Do("SENTINEL", q.cmd, rs.MasterName)
				if err != nil {
					return err
				}
				if l, _ := v.([]any); len(l) < q.want {
					return fmt.Errorf("sentinel %s knows %d %s, want %d", s.Addr(), len(l), q.cmd, q.want)
				}
			}
		}
		return nil
	})
}

func (rs *Sentinel) masterOf(s *Server) (string, error) {
	v, err := s.Do("SENTINEL", "get-master-addr-by-name", rs.MasterName)
	if err != nil {
		return "", err
	}
	l, _ := v.([]any)
	if len(l) != 2 {
		return "", fmt.Errorf("get-master-addr-by-name answered %v", v)
	}
	return net.JoinHostPort(fmt.Sprint(l[0]), fmt.Sprint(l[1])), nil
}

// URL is the redis+sentinel:// URL of the topology (the password in it
// when one is set).
func (rs *Sentinel) URL() string {
	addrs := make([]string, len(rs.Sentinels))
	for i, s := range rs.Sentinels {
		addrs[i] = s.Addr()
	}
	auth := ""
	if rs.password != "" {
		auth = ":" + rs.password + "@"
	}
	return "redis+sentinel://" + auth + strings.Join(addrs, ",") + "/" + rs.MasterName
}

// Primary is the data node the first Sentinel names as the primary.
func (rs *Sentinel) Primary(t testing.TB) *Server {
	t.Helper()
	addr, err := rs.masterOf(rs.Sentinels[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range rs.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	t.Fatalf("sentinel names %s, no node of the topology", addr)
	return nil
}

// WaitFailover waits until every Sentinel names another primary than old
// and that node says it is one, and returns it.
func (rs *Sentinel) WaitFailover(t testing.TB, old *Server, timeout time.Duration) *Server {
	t.Helper()
	var now *Server
	poll.Until(t, timeout, "the Sentinels to name a primary other than "+old.Addr(), func() error {
		now = nil
		for _, s := range rs.Sentinels {
			if s.PID() == 0 {
				continue
			}
			addr, err := rs.masterOf(s)
			if err != nil {
				return err
			}
			if addr == old.Addr() {
				return fmt.Errorf("sentinel %s still names %s", s.Addr(), addr)
			}
			for _, n := range rs.Nodes {
				if n.Addr() == addr {
					now = n
				}
			}
		}
		if now == nil {
			return errors.New("no new primary named")
		}
		info, err := now.Info("replication")
		if err != nil || info["role"] != "master" {
			return fmt.Errorf("%s role %q (%v)", now.Addr(), info["role"], err)
		}
		return nil
	})
	return now
}

// ClusterTopology configures StartCluster.
type ClusterTopology struct {
	// Primaries (default 3) and ReplicasPerPrimary (default 1).
	Primaries, ReplicasPerPrimary int
	// NodeTimeout is cluster-node-timeout (default 1s).
	NodeTimeout time.Duration
}

// Cluster is a Redis Cluster of real redis-servers on free loopback
// ports, built by redis-cli --cluster create.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts the nodes, joins them with redis-cli --cluster
// create (every slot covered, each primary with its replicas) and waits
// until every node says cluster_state:ok and the replicas are in sync; the
// nodes are closed at cleanup. A missing redis-cli fails the test (Debian's
// redis-tools has it).
func StartCluster(t testing.TB, o ClusterTopology) *Cluster {
	t.Helper()
	rc, err := LaunchCluster(o)
	if err != nil {
		t.Fatal(err)
	}
	cleanupTopology(t, "cluster", rc.Nodes)
	return rc
}

// LaunchCluster is StartCluster outside a test; the caller must
// Close it.
func LaunchCluster(o ClusterTopology) (*Cluster, error) {
	if o.Primaries <= 0 {
		o.Primaries = 3
	}
	if o.ReplicasPerPrimary == 0 {
		o.ReplicasPerPrimary = 1
	}
	o.ReplicasPerPrimary = max(o.ReplicasPerPrimary, 0)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, errors.New("redis-cli not installed: run make test as root (hack/install-deps.sh apt-installs redis-tools) or apt-get install redis-tools")
	}
	n := o.Primaries * (1 + o.ReplicasPerPrimary)
	nodes, err := launchRedisNodes(n, func(int) Options {
		return Options{Cluster: true, ClusterNodeTimeout: o.NodeTimeout, AppendFsync: "everysec"}
	})
	if err != nil {
		return nil, err
	}
	rc := &Cluster{Nodes: nodes}
	args := []string{"--cluster", "create"}
	for _, r := range rc.Nodes {
		args = append(args, r.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(o.ReplicasPerPrimary), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		rc.Close()
		return nil, fmt.Errorf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if err := rc.waitOK(60 * time.Second); err != nil {
		rc.Close()
		return nil, err
	}
	if err := waitReplicasSynced(rc.Nodes); err != nil {
		rc.Close()
		return nil, err
	}
	return rc, nil
}

// Close stops every node and removes their directories.
func (rc *Cluster) Close() error { return closeNodes(rc.Nodes) }

// URL is the redis+cluster:// URL naming every node.
func (rc *Cluster) URL() string {
	addrs := make([]string, len(rc.Nodes))
	for i, r := range rc.Nodes {
		addrs[i] = r.Addr()
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

// WaitOK waits until every running node says cluster_state:ok and sees
// every slot served by a primary that is not failed.
func (rc *Cluster) WaitOK(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := rc.waitOK(timeout); err != nil {
		t.Fatal(err)
	}
}

func (rc *Cluster) waitOK(timeout time.Duration) error {
	return poll.Wait(timeout, "the cluster state ok on every node", func() error {
		for _, r := range rc.Nodes {
			if r.PID() == 0 {
				continue
			}
			v, err := r.Do("CLUSTER", "INFO")
			if err != nil {
				return err
			}
			s, _ := v.(string)
			if !strings.Contains(s, "cluster_state:ok") || !strings.Contains(s, "cluster_slots_ok:16384") {
				return fmt.Errorf("node %s not ok yet: %.80s", r.Addr(), strings.Join(strings.Fields(s), " "))
			}
		}
		return nil
	})
}

// PrimaryForKey is the node that serves key's slot as a primary, as the
// first running node sees the cluster (a killed primary stays it until the
// cluster has failed it over).
func (rc *Cluster) PrimaryForKey(t testing.TB, key string) *Server {
	t.Helper()
	r, err := rc.primaryForKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// primaryForKey is PrimaryForKey as an error, for a poll.
func (rc *Cluster) primaryForKey(key string) (*Server, error) {
	var ask *Server
	for _, r := range rc.Nodes {
		if r.PID() != 0 {
			ask = r
			break
		}
	}
	if ask == nil {
		return nil, errors.New("no cluster node runs")
	}
	v, err := ask.Do("CLUSTER", "KEYSLOT", key)
	if err != nil {
		return nil, err
	}
	slot, _ := v.(int64)
	v, err = ask.Do("CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	text, _ := v.(string)
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		for _, rng := range f[8:] {
			lo, hi, ok := strings.Cut(rng, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.ParseInt(lo, 10, 64)
			b, err2 := strconv.ParseInt(hi, 10, 64)
			if err1 != nil || err2 != nil || slot < a || slot > b {
				continue
			}
			for _, r := range rc.Nodes {
				if r.Addr() == addr {
					return r, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no primary serves slot %d of %q", slot, key)
}

// WaitFailover waits until key's slot is served by a running primary other
// than old and every running node says cluster_state:ok; it returns the
// new primary.
func (rc *Cluster) WaitFailover(t testing.TB, key string, old *Server, timeout time.Duration) *Server {
	t.Helper()
	var now *Server
	poll.Until(t, timeout, fmt.Sprintf("the slot of %q on a running primary other than %s", key, old.Addr()), func() error {
		r, err := rc.primaryForKey(key)
		if err != nil {
			return err
		}
		if r == old || r.PID() == 0 {
			return fmt.Errorf("slot of %q still on %s", key, r.Addr())
		}
		now = r
		return nil
	})
	rc.WaitOK(t, timeout)
	return now
}
