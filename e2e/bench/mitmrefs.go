package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// The MITM references are what a user would run instead of the gateway's
// MITM: Squid 5.7 with ssl-bump (Debian's squid-openssl, unpacked by
// hack/bench-deps.sh) and mitmproxy's mitmdump, each with the bench's CA,
// trusting the target's, and forwarding straight to it (the gateway goes
// through a plain Squid; only each proxy's own CPU is compared).

// squidOpenSSLDir is where hack/bench-deps.sh unpacks squid-openssl.
const squidOpenSSLDir = "bin/bench/squid-openssl"

// mitmRef is a started MITM reference: a side of the MITM measurement.
type mitmRef struct {
	name, proxy string
	pid         int
	stop        func()
	log         func() string // the tail of its log
}

// startMITMReferences starts Squid ssl-bump and mitmdump; a missing one is
// an error that says how to get it.
func startMITMReferences(caCertPEM, caKeyPEM []byte, siteCA string) ([]mitmRef, error) {
	sq, err := startSquidBump(caCertPEM, caKeyPEM, siteCA)
	if err != nil {
		return nil, err
	}
	refs := []mitmRef{sq}
	mp, err := startMitmdump(caCertPEM, caKeyPEM, siteCA)
	if err != nil {
		sq.stop()
		return nil, err
	}
	return append(refs, mp), nil
}

// startSquidBump runs the unpacked squid-openssl with a bump
// configuration: peek at the ClientHello, then bump, minting leaves from
// the bench's CA through its certificate helper.
func startSquidBump(caCertPEM, caKeyPEM []byte, siteCA string) (mitmRef, error) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return mitmRef{}, err
	}
	base := filepath.Join(root, squidOpenSSLDir)
	bin, helper := filepath.Join(base, "usr/sbin/squid"), filepath.Join(base, "usr/lib/squid/security_file_certgen")
	if _, err := os.Stat(bin); err != nil {
		return mitmRef{}, fmt.Errorf("squid with ssl-bump: %s missing: run hack/bench-deps.sh (make bench does)", bin)
	}
	// Squid drops to the proxy user: its CA, the site's CA and the
	// helper's database are its own.
	dir, err := os.MkdirTemp("", "proxyfleet-bench-bump-")
	if err != nil {
		return mitmRef{}, err
	}
	files := map[string][]byte{"ca.pem": caCertPEM, "ca-key.pem": caKeyPEM}
	if files["site-ca.pem"], err = os.ReadFile(siteCA); err != nil {
		return mitmRef{}, err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return mitmRef{}, err
		}
	}
	db := filepath.Join(dir, "ssl_db")
	if out, err := exec.Command(helper, "-c", "-s", db, "-M", "16MB").CombinedOutput(); err != nil {
		return mitmRef{}, fmt.Errorf("%s -c: %v\n%s", helper, err, out)
	}
	if err := squid.GiveToProxy(dir); err != nil {
		return mitmRef{}, err
	}
	s, err := squid.Launch(squid.Options{
		Name:        "bench-bump",
		Binary:      bin,
		PortOptions: "ssl-bump tls-cert=" + filepath.Join(dir, "ca.pem") + " tls-key=" + filepath.Join(dir, "ca-key.pem") + " generate-host-certificates=on dynamic_cert_mem_cache_size=16MB",
		ExtraConfig: []string{
			"sslcrtd_program " + helper + " -s " + db + " -M 16MB",
			"sslcrtd_children 4 startup=1 idle=1",
			"acl step1 at_step SslBump1",
			"ssl_bump peek step1",
			"ssl_bump bump all",
			"tls_outgoing_options cafile=" + filepath.Join(dir, "site-ca.pem"),
			// Squid 5 matches a certificate's DNS names and CN, never its
			// IP addresses, and the target is https://127.0.0.1: the
			// chain is still verified (the same work), the name mismatch
			// let through.
			"sslproxy_cert_error allow all",
		},
	})
	if err != nil {
		os.RemoveAll(dir)
		return mitmRef{}, fmt.Errorf("squid with ssl-bump: %w", err)
	}
	return mitmRef{name: "squid-bump", proxy: s.URL(), pid: s.PID(), log: func() string { return s.LogTail(4096) }, stop: func() {
		_ = s.Close()
		os.RemoveAll(dir)
	}}, nil
}

// startMitmdump runs mitmproxy's mitmdump with the bench's CA (its
// confdir's mitmproxy-ca.pem: key and certificate), quiet.
func startMitmdump(caCertPEM, caKeyPEM []byte, siteCA string) (mitmRef, error) {
	bin, err := exec.LookPath("mitmdump")
	if err != nil {
		return mitmRef{}, fmt.Errorf("mitmproxy: mitmdump missing: run hack/bench-deps.sh (make bench does)")
	}
	dir, err := os.MkdirTemp("", "proxyfleet-bench-mitmproxy-")
	if err != nil {
		return mitmRef{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, "mitmproxy-ca.pem"), append(append([]byte{}, caKeyPEM...), caCertPEM...), 0o600); err != nil {
		return mitmRef{}, err
	}
	p, addrs, err := testutil.LaunchProcessOnFreePorts(bin, 1, func(addrs []string) testutil.ProcessOptions {
		host, port, _ := net.SplitHostPort(addrs[0])
		return testutil.ProcessOptions{
			Name: "mitmdump",
			Args: []string{"--listen-host", host, "--listen-port", port, "-q",
				"--set", "confdir=" + dir, "--set", "ssl_verify_upstream_trusted_ca=" + siteCA},
			WaitAddrs: addrs,
		}
	})
	if err != nil {
		os.RemoveAll(dir)
		return mitmRef{}, fmt.Errorf("mitmproxy: %w", err)
	}
	return mitmRef{name: "mitmproxy", proxy: "http://" + addrs[0], pid: p.PID(), log: p.Output, stop: func() {
		_, _ = p.Stop()
		os.RemoveAll(dir)
	}}, nil
}

// mitmGoalRows are the MITM goals for one load: the gateway's CPU per
// request at most half Squid ssl-bump's and a tenth of mitmproxy's, read
// on the default (mirror); the go fingerprint's ratios are printed beside.
// With goals false the same ratios are a reference, with no goal.
func mitmGoalRows(mirror, goFP string, mirrorCPU, goCPU, squidCPU, mitmproxyCPU time.Duration, goals bool) []row {
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	goal := func(g string, met bool) (string, bool) {
		if !goals {
			return "", true // a reference: the goals are read on another shape
		}
		return g, met
	}
	squidGoal, squidMet := goal("≤ 0.50×", ratio(mirrorCPU, squidCPU) <= 0.5)
	mpGoal, mpMet := goal("≤ 0.10×", ratio(mirrorCPU, mitmproxyCPU) <= 0.1)
	return []row{
		{metric: "  gateway CPU per request ÷ Squid ssl-bump's (" + mirror + ")", chain: us(mirrorCPU), direct: us(squidCPU) + " (Squid)",
			figure: fmt.Sprintf("%.2f×", ratio(mirrorCPU, squidCPU)), target: squidGoal, ok: squidMet},
		{metric: "  gateway CPU per request ÷ mitmproxy's (" + mirror + ")", chain: us(mirrorCPU), direct: us(mitmproxyCPU) + " (mitmproxy)",
			figure: fmt.Sprintf("%.2f×", ratio(mirrorCPU, mitmproxyCPU)), target: mpGoal, ok: mpMet},
		{metric: "  the same with --mitm-fingerprint " + goFP + ": ÷ Squid's, ÷ mitmproxy's", chain: us(goCPU),
			figure: fmt.Sprintf("%.2f×, %.2f×", ratio(goCPU, squidCPU), ratio(goCPU, mitmproxyCPU)), ok: true},
	}
}

// mitmIdleConns is how many idle MITM'd connections the memory row holds.
const mitmIdleConns = 300

// idleMITMMemory is pid's RSS growth per idle MITM'd connection through
// proxy: mitmIdleConns clients of their own, each with one request done on
// its kept connection (the client's TLS session with the proxy and the
// proxy's with the site both up), then left alone.
func idleMITMMemory(proxy string, pid int, conf *tls.Config, u string) (int64, error) {
	before := settledRSS(pid)
	clients := make([]*http.Client, mitmIdleConns)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.CloseIdleConnections()
			}
		}
	}()
	for i := range clients {
		c, err := benchClient(proxy, 1, false, conf)
		if err != nil {
			return 0, err
		}
		clients[i] = c
		if err := getOK(c, u); err != nil {
			return 0, fmt.Errorf("idle MITM'd connection %d: %w", i, err)
		}
	}
	return (settledRSS(pid) - before) / mitmIdleConns, nil
}

// idleMITMRow is the MITM memory goal: an idle MITM'd connection costs
// the gateway (default fingerprint) no more than it costs Squid ssl-bump.
func idleMITMRow(gw, sq int64) row {
	return row{metric: fmt.Sprintf("memory per idle MITM'd connection (RSS delta, %d connections)", mitmIdleConns), chain: kib(gw), direct: kib(sq) + " (Squid ssl-bump)",
		figure: fmt.Sprintf("%.2f×", float64(gw)/float64(sq)), target: "≤ Squid's", ok: gw <= sq}
}
