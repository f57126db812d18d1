package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

func topoStore(t *testing.T, url, prefix string, o RedisOptions) *RedisStore {
	t.Helper()
	o.URL, o.Prefix = url, prefix
	if o.Store.Cooldown.Default == 0 {
		o.Store = pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Hour, Max: 2 * time.Hour}, MaxTTL: 2 * time.Hour}
	}
	s, err := NewRedisStore(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// failoverUnderLoad bans member b for site.com, then runs acquire, report
// and release cycles from four callers while kill takes the primary away
// and waitNew waits for its successor, and for a second after. It wants
// no call to fail and the ban to hold on the new primary.
func failoverUnderLoad(t *testing.T, s *RedisStore, kill func(), waitNew func()) {
	t.Helper()
	ctx := context.Background()
	s.SetMembers([]pool.Member{proxyMember(t, "a"), proxyMember(t, "b"), proxyMember(t, "c")})
	l := cAcquire(t, s, pool.AcquireRequest{Proxy: "b", Target: "site.com", TTL: time.Hour})
	cReport(t, s, l.ID, pool.Report{Result: rotation.ResultBanned, Target: "site.com"})
	var (
		cycles, failed atomic.Int64
		first          atomic.Value
		stop           = make(chan struct{})
		wg             sync.WaitGroup
	)
	for i := range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := func() error {
					l, err := s.Acquire(ctx, pool.AcquireRequest{Target: fmt.Sprintf("load%d.com", i)})
					if err != nil {
						return err
					}
					if err := s.Report(ctx, l.ID, pool.Report{Result: rotation.ResultOK, Target: l.Target}); err != nil {
						return err
					}
					return s.Release(ctx, l.ID)
				}()
				cycles.Add(1)
				if err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	before := cycles.Load()
	start := time.Now()
	kill()
	waitNew()
	took := time.Since(start)
	during := cycles.Load() - before
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d cycles (%d before the kill, %d during the failover, %d in the second after it), %d failed; the new primary answered %s after the kill",
		cycles.Load(), before, during, cycles.Load()-before-during, failed.Load(), took.Round(time.Millisecond))
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d cycles failed across the failover; first: %v", n, cycles.Load(), first.Load())
	}
	if cycles.Load() <= before {
		t.Fatal("no cycle completed after the kill")
	}
	if left := memberStatus(t, s, "b").Cooldowns["site.com"]; time.Until(left) < 30*time.Minute {
		t.Fatalf("the ban reported before the failover did not survive it: b cools down for site.com until %v", left)
	}
	for range 6 {
		if got := cAcquire(t, s, pool.AcquireRequest{Target: "site.com"}); got.Member.Name == "b" {
			t.Fatal("site.com leased b after the failover; b is banned there")
		}
	}
}

func TestRedisStoreRidesOutASentinelFailover(t *testing.T) {
	t.Parallel()
	rs := redis.StartSentinel(t, redis.SentinelTopology{Password: "sentinel-pw"})
	s := topoStore(t, rs.URL(), "failover", RedisOptions{})
	old := rs.Primary(t)
	failoverUnderLoad(t, s, func() {
		if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
	}, func() { rs.WaitFailover(t, old, 60*time.Second) })
}

func TestRedisStoreRidesOutAClusterFailover(t *testing.T) {
	t.Parallel()
	rc := redis.StartCluster(t, redis.ClusterTopology{})
	s := topoStore(t, rc.URL(), "failover", RedisOptions{})
	old := rc.PrimaryForKey(t, "{failover}:")
	failoverUnderLoad(t, s, func() {
		if err := old.Kill(); err != nil {
			t.Fatal(err)
		}
	}, func() { rc.WaitFailover(t, "{failover}:", old, 60*time.Second) })
}

func TestRedisStoreOverTLSVerifiesTheServer(t *testing.T) {
	t.Parallel()
	ca := redis.NewCA(t, "lease-store-ca")
	client := ca.Issue(t, "client")
	r := redis.Start(t, redis.Options{Password: "tls-pw",
		TLS: &redis.TLS{CA: ca, Server: ca.Issue(t, "server"), Client: client, AuthClients: true}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	good := topoStore(t, r.URL(), "tls", RedisOptions{CAFile: ca.CertFile, CertFile: client.CertFile, KeyFile: client.KeyFile})
	if err := good.Ping(ctx); err != nil {
		t.Fatalf("the right CA and a client certificate: %v", err)
	}
	good.SetMembers([]pool.Member{proxyMember(t, "a")})
	cAcquire(t, good, pool.AcquireRequest{})

	wrong := redis.NewCA(t, "another-ca")
	for _, c := range []struct {
		name string
		o    RedisOptions
		want error
	}{
		{"a wrong CA", RedisOptions{CAFile: wrong.CertFile, CertFile: client.CertFile, KeyFile: client.KeyFile}, ErrTLS},
		{"no CA file (system roots)", RedisOptions{CertFile: client.CertFile, KeyFile: client.KeyFile}, ErrTLS},
		{"no client certificate", RedisOptions{CAFile: ca.CertFile}, ErrTLSClientCert},
	} {
		s := topoStore(t, r.URL(), "tls", c.o)
		err := s.Ping(ctx)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: Ping = %v, want %v", c.name, err, c.want)
			continue
		}
		if errors.Is(err, pool.ErrStoreUnavailable) || strings.Contains(err.Error(), "tls-pw") {
			t.Errorf("%s: %v is an outage or shows the password", c.name, err)
		}
		if _, err := s.Acquire(ctx, pool.AcquireRequest{}); !errors.Is(err, ErrTLS) {
			t.Errorf("%s: Acquire = %v, want ErrTLS", c.name, err)
		}
	}
	// A plaintext URL to the TLS port is no fallback either: it fails.
	plain := topoStore(t, strings.Replace(r.URL(), "rediss://", "redis://", 1), "tls", RedisOptions{})
	if err := plain.Ping(ctx); err == nil {
		t.Error("redis:// to the TLS port answered")
	}
	for _, o := range []RedisOptions{
		{URL: strings.Replace(r.URL(), "rediss://", "redis://", 1), CAFile: ca.CertFile},
		{URL: r.URL(), CAFile: client.KeyFile},
		{URL: r.URL(), CertFile: client.CertFile},
	} {
		if _, err := NewRedisStore(o); err == nil {
			t.Errorf("%+v accepted", o)
		} else if strings.Contains(err.Error(), "tls-pw") {
			t.Errorf("error shows the password: %v", err)
		}
	}
}

func TestRedisStoreSaysWhatIsWrongWithATopology(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// No Sentinel answers: three addresses of this test's own that close
	// every connection at once. (Addresses nobody listened on were free
	// only when looked at: a parallel test's redis-server took one, and
	// the store met a Redis that is no Sentinel.)
	var addrs []string
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		addrs = append(addrs, ln.Addr().String())
	}
	s := topoStore(t, "redis+sentinel://:hunter2@"+strings.Join(addrs, ",")+"/leases", "topo", RedisOptions{FailoverWait: 500 * time.Millisecond})
	t0 := time.Now()
	err := s.Ping(ctx)
	t.Logf("sentinel ping %s: %v", time.Since(t0), err)
	if !errors.Is(err, pool.ErrStoreUnavailable) || !strings.Contains(err.Error(), "sentinel") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("no Sentinel answering: %v, want an unavailable store naming the Sentinels, no password", err)
	}
	// A Cluster with slots no node serves.
	n := redis.Start(t, redis.Options{Cluster: true})
	if _, err := n.Do("CLUSTER", "ADDSLOTSRANGE", "0", "100"); err != nil {
		t.Fatal(err)
	}
	c := topoStore(t, "redis+cluster://"+n.Addr(), "topo", RedisOptions{FailoverWait: 500 * time.Millisecond})
	t0 = time.Now()
	err = c.Ping(ctx)
	t.Logf("cluster ping %s: %v", time.Since(t0), err)
	if !errors.Is(err, pool.ErrStoreUnavailable) || !strings.Contains(err.Error(), "CLUSTERDOWN") {
		t.Errorf("a slot uncovered: %v, want an unavailable store saying CLUSTERDOWN", err)
	}
}

// TestMovingAPrefixToAnotherDeploymentKeepsItsBans runs the copy that
// docs/operations.md gives for moving a fleet to another Redis (here from a
// single server to a Cluster): redis-cli --scan for the prefix's keys, then
// MIGRATE ... COPY REPLACE KEYS into the node serving the prefix's slot. A
// store on the new deployment sees the ban, its end and the live lease.
func TestMovingAPrefixToAnotherDeploymentKeepsItsBans(t *testing.T) {
	t.Parallel()
	oldRedis := redis.Start(t, redis.Options{Password: "old-pw"})
	_, rc := topologies(t)
	const prefix = "moving"
	old := topoStore(t, oldRedis.URL(), prefix, RedisOptions{})
	old.SetMembers([]pool.Member{proxyMember(t, "a"), proxyMember(t, "b")})
	l := cAcquire(t, old, pool.AcquireRequest{Proxy: "b", Target: "site.com", TTL: time.Hour})
	cReport(t, old, l.ID, pool.Report{Result: rotation.ResultBanned, Target: "site.com"})
	until := memberStatus(t, old, "b").Cooldowns["site.com"]

	target := rc.PrimaryForKey(t, "{"+prefix+"}:")
	host, port, _ := strings.Cut(target.Addr(), ":")
	oldHost, oldPort, _ := strings.Cut(oldRedis.Addr(), ":")
	script := `set -eu
redis-cli -h "$OLD_HOST" -p "$OLD_PORT" -a "$OLD_PASSWORD" --no-auth-warning --scan --pattern "{$PREFIX}:*" > keys.txt
xargs -a keys.txt -n 200 redis-cli -h "$OLD_HOST" -p "$OLD_PORT" -a "$OLD_PASSWORD" --no-auth-warning MIGRATE "$NEW_HOST" "$NEW_PORT" "" 0 10000 COPY REPLACE KEYS
`
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = t.TempDir()
	cmd.Env = append(cmd.Environ(), "OLD_HOST="+oldHost, "OLD_PORT="+oldPort, "OLD_PASSWORD=old-pw", "PREFIX="+prefix, "NEW_HOST="+host, "NEW_PORT="+port)
	if out, err := cmd.CombinedOutput(); err != nil || strings.Contains(string(out), "ERR") {
		t.Fatalf("the copy: %v\n%s", err, out)
	}
	moved := topoStore(t, rc.URL(), prefix, RedisOptions{})
	b := memberStatus(t, moved, "b")
	if !b.Cooldowns["site.com"].Equal(until) || b.ActiveLeases != 1 {
		t.Fatalf("on the new deployment b = %+v, want the ban until %v and its lease", b, until)
	}
	for range 4 {
		if got := cAcquire(t, moved, pool.AcquireRequest{Target: "site.com"}); got.Member.Name == "b" {
			t.Fatal("the new deployment leased b for site.com, which banned it")
		}
	}
	cRelease(t, moved, l.ID)
}
