package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/mitmca"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// mitmBench measures what MITM costs against a plain tunnel, both through
// the same Squid to the same HTTPS target: a second gateway with
// --mitm-ca-cert beside the plain one (tunnelURL, pid tunnelPID). Two
// loads: keep-alive (a crawler's usual shape: one tunnel, many requests;
// under MITM each is a request the gateway reads, classifies and forwards
// over its own pooled TLS connection to the site) and a new tunnel per
// request (a TLS handshake with the client, and the leaf from the cache).
func mitmBench(cfg config, bin string, squid *testutil.Squid, target *testutil.Target, tunnelURL string, tunnelPID int) ([]row, error) {
	certPEM, keyPEM, err := mitmca.Generate("proxyfleet bench CA", time.Hour, time.Now())
	if err != nil {
		return nil, err
	}
	caFile, err := writeTemp("mitm-ca.pem", string(certPEM))
	if err != nil {
		return nil, err
	}
	defer os.Remove(caFile)
	keyFile, err := writeTemp("mitm-ca-key.pem", string(keyPEM))
	if err != nil {
		return nil, err
	}
	defer os.Remove(keyFile)
	siteCA, err := writeTemp("site-ca.pem", string(target.CertPEM()))
	if err != nil {
		return nil, err
	}
	defer os.Remove(siteCA)
	gw, addrs, err := testutil.LaunchProcessOnFreePorts(bin, 2, func(addrs []string) testutil.ProcessOptions {
		return testutil.ProcessOptions{
			Name: "gateway-mitm",
			Args: []string{"gateway", "--listen", addrs[0], "--metrics-listen", addrs[1],
				"--upstream", squid.URL(), "--allow-private-targets", "--log-level", "warn",
				"--mitm-ca-cert", caFile, "--mitm-ca-key", keyFile, "--upstream-ca-file", siteCA},
			WaitAddrs: addrs,
		}
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if code, err := gw.Stop(); err != nil || code != 0 {
			fmt.Fprintf(os.Stderr, "MITM gateway exit %d %v\n%s", code, err, gw.Output())
		}
	}()
	mitmRoots := x509.NewCertPool()
	mitmRoots.AppendCertsFromPEM(certPEM)
	type side struct {
		name, proxy string
		pid         int
		tls         *tls.Config
	}
	sides := []side{
		{"tunnel", tunnelURL, tunnelPID, target.ClientTLSConfig()},
		{"mitm", "http://" + addrs[0], gw.PID(), &tls.Config{RootCAs: mitmRoots, ServerName: target.Host(), MinVersion: tls.VersionTLS12}},
	}
	u := target.URL() + "/"
	var rows []row
	for _, shape := range []struct {
		label   string
		newConn bool
	}{{"HTTPS keep-alive", false}, {"HTTPS new tunnel per request", true}} {
		fmt.Printf("%s: MITM against a plain tunnel ...\n", shape.label)
		rps := make([]float64, len(sides))
		cpu := make([]time.Duration, len(sides))
		clients := make([]*http.Client, len(sides))
		for i, s := range sides {
			c, err := benchClient(s.proxy, cfg.concurrency, shape.newConn, s.tls)
			if err != nil {
				return nil, err
			}
			defer c.CloseIdleConnections()
			clients[i] = c
			if _, _, err := load(c, func(c *http.Client) error { return getOK(c, u) }, cfg.concurrency, 500*time.Millisecond); err != nil {
				return nil, fmt.Errorf("%s %s warm-up: %w", shape.label, s.name, err)
			}
		}
		var n [2]int64
		var elapsed [2]time.Duration
		for round := 0; round < cfg.rounds; round++ {
			for i, s := range sides {
				c0 := cpuTime(s.pid)
				k, d, err := load(clients[i], func(c *http.Client) error { return getOK(c, u) }, cfg.concurrency, cfg.duration)
				if err != nil {
					return nil, fmt.Errorf("%s %s: %w", shape.label, s.name, err)
				}
				n[i] += k
				elapsed[i] += d
				cpu[i] += cpuTime(s.pid) - c0
			}
		}
		for i, s := range sides {
			rps[i] = float64(n[i]) / elapsed[i].Seconds()
			cpu[i] /= time.Duration(max(n[i], 1))
			fmt.Printf("  %-6s %8.0f req/s  gateway %9s/req\n", s.name, rps[i], us(cpu[i]))
		}
		rows = append(rows,
			row{shape.label + ", MITM ÷ plain tunnel, req/s", f0(rps[1]) + " (MITM)", f0(rps[0]) + " (tunnel)", fmt.Sprintf("%.2f×", rps[1]/rps[0]), "", true},
			row{"  gateway CPU per request, MITM vs tunnel", us(cpu[1]), us(cpu[0]), fmt.Sprintf("%.2f×", float64(cpu[1])/float64(cpu[0])), "", true},
		)
	}
	return rows, nil
}
