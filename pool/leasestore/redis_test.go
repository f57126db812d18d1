//go:build !sidecar

package leasestore

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/pool"
)

// flagNames are the proxyfleet command's names of the settings.
var flagNames = Names{URL: "--lease-store", CAFile: "--lease-store-ca-file", CertFile: "--lease-store-cert-file", KeyFile: "--lease-store-key-file"}

// A TLS lease store that the given files cannot reach stops the start with
// an error naming the setting (the flag) to fix; one that is merely down is
// logged, naming --lease-store, and served as 503 until it answers. The
// password shows in neither.
func TestOpenRedisStoreNamesTheFlagOfATopologyItCannotUse(t *testing.T) {
	t.Parallel()
	ca := redis.NewCA(t, "flags-ca")
	client := ca.Issue(t, "client")
	r := redis.Start(t, redis.Options{Password: "hunter2",
		TLS: &redis.TLS{CA: ca, Server: ca.Issue(t, "server"), Client: client, AuthClients: true}})
	wrong := redis.NewCA(t, "wrong-ca")
	base := Config{URL: r.URL(), Prefix: "flags", Names: flagNames}
	observe := func(string, time.Duration, error) {}
	for _, c := range []struct {
		name string
		l    Config
		want string
	}{
		{"a wrong CA", Config{CAFile: wrong.CertFile, CertFile: client.CertFile, KeyFile: client.KeyFile}, "--lease-store-ca-file " + wrong.CertFile},
		{"no CA (system roots)", Config{CertFile: client.CertFile, KeyFile: client.KeyFile}, "--lease-store-ca-file (none: the system roots)"},
		{"no client certificate", Config{CAFile: ca.CertFile}, "--lease-store-cert-file (none)"},
		{"a CA file that is a key", Config{CAFile: client.KeyFile}, "--lease-store-ca-file " + client.KeyFile},
	} {
		l := base
		l.CAFile, l.CertFile, l.KeyFile = c.l.CAFile, c.l.CertFile, c.l.KeyFile
		_, _, err := openRedis(l, pool.StoreOptions{}, slog.New(slog.DiscardHandler), observe)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v, want an error naming %q without the password", c.name, err, c.want)
		}
	}
	good := base
	good.CAFile, good.CertFile, good.KeyFile = ca.CertFile, client.CertFile, client.KeyFile
	var logs bytes.Buffer
	s, closeStore, err := openRedis(good, pool.StoreOptions{}, slog.New(slog.NewTextHandler(&logs, nil)), observe)
	if err != nil {
		t.Fatalf("the right CA and certificate: %v", err)
	}
	defer closeStore()
	s.SetMembers(nil)
	if !strings.Contains(logs.String(), "lease store on Redis") || strings.Contains(logs.String(), "hunter2") {
		t.Errorf("start log %q", logs.String())
	}

	// Down, not misconfigured: no Sentinel answers.
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	down := Config{URL: "redis+sentinel://:hunter2@" + addr + "/leases", Prefix: "flags", Names: flagNames}
	_, closeDown, err := openRedis(down, pool.StoreOptions{}, slog.New(slog.NewTextHandler(&logs, nil)), observe)
	if err != nil {
		t.Fatalf("an unreachable Sentinel stopped the start: %v", err)
	}
	defer closeDown()
	if out := logs.String(); !strings.Contains(out, "--lease-store") || !strings.Contains(out, "sentinels") || strings.Contains(out, "hunter2") {
		t.Errorf("unreachable Sentinel logged %q: want the flag and the Sentinels named, no password", out)
	}
}
