package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/mitmca"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// mitmBench measures what MITM costs against a plain tunnel, all through
// the same Squid to the same HTTPS target: two more gateways with
// --mitm-ca-cert, one mirroring the client's ClientHello (the default) and
// one with --mitm-fingerprint go, beside the plain one (tunnelURL, pid
// tunnelPID). Two loads: keep-alive (a crawler's usual shape: one tunnel,
// many requests; under MITM each is a request the gateway reads,
// classifies and forwards, over the tunnel's own site connection under
// mirror, over a pooled one under go) and a new tunnel per request (a TLS
// handshake with the client, the leaf from the cache, and under mirror a
// new site connection with its own handshake). The relay (the floor of the
// speed goals) carries the same tunnels in the same rounds: what any hop
// costs for those bytes, beside what MITM costs for them.
func mitmBench(cfg config, bin string, sq *squid.Squid, target *testutil.Target, tunnelURL string, tunnelPID int, relay benchPath) ([]row, error) {
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
	// One MITM gateway per site-facing handshake: the client's mirrored
	// (the default) and Go's.
	var mitmAddrs []string
	var mitmPIDs []int
	for _, fp := range []string{"mirror", "go"} {
		gw, addrs, stop, err := launchGateway("gateway-mitm-"+fp, bin, 2, nil, func(addrs []string) []string {
			return []string{"gateway", "--listen", addrs[0], "--metrics-listen", addrs[1],
				"--upstream", sq.URL(), "--allow-private-targets", "--log-level", "warn",
				"--mitm-ca-cert", caFile, "--mitm-ca-key", keyFile, "--upstream-ca-file", siteCA, "--mitm-fingerprint", fp}
		})
		if err != nil {
			return nil, err
		}
		defer stop()
		mitmAddrs = append(mitmAddrs, addrs[0])
		mitmPIDs = append(mitmPIDs, gw.PID())
	}
	mitmRoots := x509.NewCertPool()
	mitmRoots.AppendCertsFromPEM(certPEM)
	type side struct {
		name, proxy string
		pid         int
		tls         *tls.Config
		log         func() string // a reference's log, for a failure
	}
	mitmTLS := &tls.Config{RootCAs: mitmRoots, ServerName: target.Host(), MinVersion: tls.VersionTLS12}
	sides := []side{
		{"tunnel", tunnelURL, tunnelPID, target.ClientTLSConfig(), nil},
		{"mirror", "http://" + mitmAddrs[0], mitmPIDs[0], mitmTLS, nil},
		{"go", "http://" + mitmAddrs[1], mitmPIDs[1], mitmTLS, nil},
	}
	refs, err := startMITMReferences(certPEM, keyPEM, siteCA)
	if err != nil {
		return nil, err
	}
	for _, r := range refs {
		defer r.stop()
		sides = append(sides, side{r.name, r.proxy, r.pid, mitmTLS, r.log})
	}
	relaySide := len(sides)
	sides = append(sides, side{relay.name, relay.proxy, relay.pid, target.ClientTLSConfig(), nil})
	u := target.URL() + "/"
	var rows []row
	// The third shape is the second with clients that resume their TLS
	// sessions, as browsers do (Go's client does only with a session
	// cache): with the proxy, or through a plain tunnel with the site. The
	// goals are read on the second; the third says what resumption buys
	// each proxy, and how often each let its clients resume.
	for _, shape := range []struct {
		label           string
		newConn, resume bool
	}{{"HTTPS keep-alive", false, false}, {"HTTPS new tunnel per request", true, false},
		{"HTTPS new tunnel per request, clients resuming", true, true}} {
		fmt.Printf("%s: MITM against a plain tunnel ...\n", shape.label)
		rps := make([]float64, len(sides))
		cpu := make([]time.Duration, len(sides))
		clients := make([]*http.Client, len(sides))
		resumed := make([]*resumeCount, len(sides))
		for i, s := range sides {
			conf := s.tls
			if shape.resume {
				conf, resumed[i] = resuming(s.tls)
			}
			c, err := benchClient(s.proxy, cfg.concurrency, shape.newConn, conf)
			if err != nil {
				return nil, err
			}
			defer c.CloseIdleConnections()
			clients[i] = c
			if _, _, err := load(c, func(c *http.Client) error { return getOK(c, u) }, cfg.concurrency, 500*time.Millisecond); err != nil {
				if s.log != nil {
					err = fmt.Errorf("%w\n%s's log:\n%s", err, s.name, s.log())
				}
				return nil, fmt.Errorf("%s %s warm-up: %w", shape.label, s.name, err)
			}
		}
		n := make([]int64, len(sides))
		elapsed := make([]time.Duration, len(sides))
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
			fmt.Printf("  %-10s %8.0f req/s  proxy %9s/req\n", s.name, rps[i], us(cpu[i]))
		}
		rows = append(rows,
			row{shape.label + ", MITM mirror ÷ plain tunnel, req/s", f0(rps[1]) + " (mirror)", f0(rps[0]) + " (tunnel)", fmt.Sprintf("%.2f×", rps[1]/rps[0]), "", true},
			row{"  MITM go ÷ plain tunnel, req/s", f0(rps[2]) + " (go)", f0(rps[0]) + " (tunnel)", fmt.Sprintf("%.2f×", rps[2]/rps[0]), "", true},
			row{"  gateway CPU per request, mirror vs tunnel", us(cpu[1]), us(cpu[0]), fmt.Sprintf("%.2f×", float64(cpu[1])/float64(cpu[0])), "", true},
			row{"  gateway CPU per request, go vs tunnel", us(cpu[2]), us(cpu[0]), fmt.Sprintf("%.2f×", float64(cpu[2])/float64(cpu[0])), "", true},
		)
		rows = append(rows, mitmGoalRows(sides[1].name, sides[2].name, cpu[1], cpu[2], cpu[3], cpu[4], !shape.resume)...)
		if shape.resume {
			var each []string
			for i, s := range sides {
				each = append(each, s.name+" "+resumed[i].String())
			}
			rows = append(rows, row{"  connections whose client resumed its session", strings.Join(each, ", "), "", "", "", true})
		}
		rows = append(rows,
			row{"  the same tunnels through the relay: relay CPU per request (the hop's floor, reference)", us(cpu[relaySide]), "", "", "", true},
			row{"  gateway CPU per request ÷ the relay's: mirror, go, plain tunnel", us(cpu[1]), us(cpu[relaySide]) + " (relay)",
				fmt.Sprintf("%.2f×, %.2f×, %.2f×", float64(cpu[1])/float64(cpu[relaySide]), float64(cpu[2])/float64(cpu[relaySide]), float64(cpu[0])/float64(cpu[relaySide])), "", true},
		)
	}
	// The cost model's MITM row: a request on a kept MITM'd tunnel against
	// one on a kept plain tunnel (the gateway only relays its bytes).
	fmt.Println("cost model: system calls per MITM'd request (strace -c) ...")
	var per [2]float64
	for i, s := range sides[:2] {
		c, err := benchClient(s.proxy, 1, false, s.tls)
		if err != nil {
			return nil, err
		}
		n, err := syscallsPer(s.pid, c, func(c *http.Client) error { return getOK(c, u) }, costUnits)
		c.CloseIdleConnections()
		if err != nil {
			return nil, fmt.Errorf("cost model, %s: %w", s.name, err)
		}
		per[i] = n
	}
	rows = append(rows, costRow("MITM'd keep-alive request ("+sides[1].name+")", per[1], per[0], "on a plain tunnel"))
	fmt.Printf("memory of %d idle MITM'd connections ...\n", mitmIdleConns)
	var mem [2]int64
	for i, s := range []side{sides[1], sides[3]} {
		if mem[i], err = idleMITMMemory(s.proxy, s.pid, s.tls, u); err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	rows = append(rows, idleMITMRow(mem[0], mem[1]))
	return rows, nil
}

// resumeCount counts a client's TLS connections and those that resumed.
type resumeCount struct{ all, resumed atomic.Int64 }

func (r *resumeCount) String() string {
	return fmt.Sprintf("%.0f%%", 100*float64(r.resumed.Load())/float64(max(r.all.Load(), 1)))
}

// resuming is conf with a session cache of its own, counting resumptions.
func resuming(conf *tls.Config) (*tls.Config, *resumeCount) {
	r := &resumeCount{}
	c := conf.Clone()
	c.ClientSessionCache = tls.NewLRUClientSessionCache(64)
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		r.all.Add(1)
		if cs.DidResume {
			r.resumed.Add(1)
		}
		return nil
	}
	return c, r
}
