package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/mitmca"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// MITMOptions turns on TLS interception of CONNECT tunnels (Options.MITM).
type MITMOptions struct {
	// CA signs the per-host leaves; required.
	CA *mitmca.CA
	// Bypass are the hosts left as plain tunnels (pinned or mutual-TLS sites).
	Bypass HostPatterns
}

// mitmHello is the gateway's own answer to a CONNECT it intercepts.
var mitmHello = []byte("HTTP/1.1 200 Connection established\r\n" + HeaderMITM + ": on\r\n\r\n")

// mitm is the gateway's MITM side: the CA that signs the leaves and the
// hosts left alone. The connections it terminates are served by the
// gateway's inner server (inner.go), as plain HTTP carried in a CONNECT is.
type mitm struct {
	ca     *mitmca.CA
	bypass HostPatterns
}

func newMITM(o *MITMOptions) (*mitm, error) {
	if o.CA == nil {
		return nil, errors.New("gateway: Options.MITM.CA is required")
	}
	return &mitm{ca: o.CA, bypass: o.Bypass}, nil
}

// wanted reports whether a CONNECT to host is intercepted: not a bypassed
// host, and the client did not say X-Proxyfleet-Mitm: off.
func (m *mitm) wanted(r *http.Request, host string) bool {
	return !leftAlone(r) && !m.bypass.Match(host)
}

// leftAlone reports a CONNECT whose client said X-Proxyfleet-Mitm: off:
// its tunnel is a plain one through a member, whatever it carries.
func leftAlone(r *http.Request) bool {
	v := r.Header[HeaderMITM]
	return len(v) > 0 && strings.EqualFold(strings.TrimSpace(v[0]), "off")
}

// serveMITM answers a checked CONNECT itself, terminates the client's TLS
// with a leaf for host, and hands the connection to the inner server. No
// member is leased here: each request inside the tunnel leases (and may
// rotate) on its own, through the same path as plain HTTP.
func (g *Gateway) serveMITM(w http.ResponseWriter, r *http.Request, p *params, hostport, host string, port uint16, start time.Time) {
	rq := &request{w: w, start: start}
	rq.lr.target = rotation.HostKey(host) // the span's target; no lease is taken here
	c, ok := g.takeTunnel(w, r, rq, mitmHello)
	if !ok {
		return
	}
	ca := g.mitm.ca
	tc := tls.Server(c, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			// The CONNECT authority names the site, whatever the SNI says
			// (IP literals have none): that is the host that was checked.
			return ca.LeafFor(host)
		},
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	})
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), g.dialTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		_ = tc.Close()
		msg := err.Error()
		if strings.Contains(msg, "unknown certificate authority") || strings.Contains(msg, "bad certificate") ||
			strings.Contains(msg, "certificate unknown") {
			g.log.Warn("a client refused the MITM certificate: does it trust the --mitm-ca-cert CA? (docs/mitm.md)", "target", host, "err", err)
		} else {
			g.log.Debug("MITM handshake with the client failed", "target", host, "err", err)
		}
		g.ended(r.Context(), rq, OutcomeClientGone, "")
		return
	}
	_ = tc.SetDeadline(time.Time{})
	g.inner.serve(tc, &innerTunnel{p: *p, scheme: "https", hostport: hostport, host: host, port: port})
}
