package gateway

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/internal/bufpool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// exchange is the stage that makes one attempt over a member link: a
// request sent and its answer's head read (send: the member's Transport,
// the lean path or a mirroring tunnel's own site link), a WebSocket
// handshake (handshake), each bounded by the member's answer timeout, and
// the part of an answer the classifier reads (readAnswer). Its errors
// leave classified for judge. It owns the gateway's own TLS to sites (the
// mirrored handshake and its fallback presets) and the buffers of
// requests written on the gateway's own connections; it calls the member
// links stage (linkDialer) for its connections and nothing after it.
type exchange struct {
	links         linkDialer
	classifier    rotation.Classifier
	banBodyBytes  int
	answerTimeout time.Duration // the default (Options.MemberAnswerTimeout)
	siteTimeouts  sites.Durations
	dialTimeout   time.Duration
	siteRoots     *x509.CertPool
	mitm          *mitm           // the presets and site sessions of mirroring tunnels; nil without MITM
	writers       bufpool.Writers // for requests written on the gateway's own connections (writeRequest)
	rec           Recorder
	log           *slog.Logger
}

// linkDialer is what an attempt asks of the member links stage: a
// connection that carries bytes to a target through a member, or one to
// the member itself.
type linkDialer interface {
	dialConnect(ctx context.Context, mc *link.Link, hostport, host string, port uint16, addrs []netip.Addr, answerTimeout time.Duration) (net.Conn, []byte, error)
	dialMember(ctx context.Context, mc *link.Link) (net.Conn, error)
}

func newExchange(o Options, links linkDialer, m *mitm) *exchange {
	return &exchange{links: links, classifier: o.Classifier, banBodyBytes: o.BanBodyBytes, answerTimeout: o.MemberAnswerTimeout,
		siteTimeouts: o.SiteAnswerTimeouts, dialTimeout: o.DialTimeout, siteRoots: o.SiteRoots, mitm: m, rec: o.Metrics, log: o.Logger}
}

// tunnel is a CONNECT's attempt: a connection through mc that carries
// bytes to hostport, up once the member's answer is 2xx (early: bytes it
// sent behind its answer).
func (x *exchange) tunnel(ctx context.Context, mc *link.Link, hostport, host string, port uint16, addrs []netip.Addr, answerTimeout time.Duration) (net.Conn, []byte, error) {
	return x.links.dialConnect(ctx, mc, hostport, host, port, addrs, answerTimeout)
}
