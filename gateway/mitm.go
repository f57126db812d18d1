package gateway

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/mirror"
	"github.com/proxyfleet/proxyfleet/gateway/mitmca"
	"github.com/proxyfleet/proxyfleet/gateway/params"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// MITMOptions turns on TLS interception of CONNECT tunnels (Options.MITM).
type MITMOptions struct {
	// CA signs the per-host leaves; required.
	CA *mitmca.CA
	// Bypass are the hosts left as plain tunnels (pinned or mutual-TLS sites).
	Bypass sites.Hosts
	// Fingerprint is the site-facing TLS handshake: FingerprintMirror
	// (the default, when empty) or FingerprintGo; X-Proxyfleet-Fingerprint
	// overrides it per tunnel or request.
	Fingerprint Fingerprint
	// FallbackPreset names the mirror.Presets entry sent for a client
	// whose ClientHello cannot be mirrored ("": mirror.DefaultPreset).
	FallbackPreset string
}

// mitmHello is the gateway's own answer to a CONNECT it intercepts.
var mitmHello = []byte("HTTP/1.1 200 Connection established\r\n" + HeaderMITM + ": on\r\n\r\n")

// mitm is the gateway's MITM side: the CA that signs the leaves, the
// hosts left alone and the site-facing handshake. The connections it
// terminates are served by the gateway's inner server (inner.go), as plain
// HTTP carried in a CONNECT is.
type mitm struct {
	ca     *mitmca.CA
	bypass sites.Hosts
	fp     Fingerprint
	preset mirror.Preset
	// tickets holds the session ticket keys every client-facing handshake
	// shares (a config of its own per connection would make tickets no
	// other connection can read): crypto/tls's own, random per process and
	// rotated daily, so a restart or another replica makes a client
	// handshake in full.
	tickets *tls.Config
	// lineages numbers the client sessions the gateway issues tickets for;
	// sites are the sessions sites gave connections made for them.
	lineages atomic.Uint64
	sites    *mirror.Sessions
}

// siteSessionsKept bounds the site sessions kept for clients that may
// resume: ≈ 0.7 KiB each (the site's certificates are shared by every
// session with it), so at most ≈ 360 KiB and the chains of the sites they
// name. A client that resumes does so soon after its visit; one that never
// does (a one-shot curl) only takes a place the oldest gives up.
const siteSessionsKept = 512

// lineageTag marks the gateway's lineage number in a ticket's extra data.
const lineageTag = "proxyfleet-lineage:"

func newMITM(o *MITMOptions) (*mitm, error) {
	if o.CA == nil {
		return nil, errors.New("gateway: Options.MITM.CA is required")
	}
	fp := o.Fingerprint
	if fp == "" {
		fp = FingerprintMirror
	}
	if _, err := ParseFingerprint(string(fp)); err != nil {
		return nil, errors.New("gateway: Options.MITM.Fingerprint: " + err.Error())
	}
	name := o.FallbackPreset
	if name == "" {
		name = mirror.DefaultPreset
	}
	preset, err := mirror.PresetByName(name)
	if err != nil {
		return nil, errors.New("gateway: Options.MITM.FallbackPreset: " + err.Error())
	}
	return &mitm{ca: o.CA, bypass: o.Bypass, fp: fp, preset: preset, tickets: &tls.Config{}, sites: mirror.NewSessions(siteSessionsKept)}, nil
}

// lineage is a client connection's place in a chain of TLS sessions: the
// number its tickets carry, taken from the ticket it resumed with or new.
type lineage struct{ n uint64 }

// serverConfig is the TLS server for a client's CONNECT to host. Its
// tickets carry the client's lineage, so a client that resumes later is
// known as the same client session: under mirror the site leg then
// resumes too (siteResumption), as the client would have with the site.
func (m *mitm) serverConfig(host string, fp Fingerprint, lin *lineage) *tls.Config {
	cfg := m.tickets.Clone()
	// The CONNECT authority names the site, whatever the SNI says (IP
	// literals have none): that is the host that was checked.
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return m.ca.LeafFor(host) }
	cfg.NextProtos = nextProtos(fp)
	cfg.MinVersion = tls.VersionTLS12
	cfg.UnwrapSession = func(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
		ss, err := m.tickets.DecryptTicket(identity, cs)
		if ss != nil {
			for _, e := range ss.Extra {
				if len(e) == len(lineageTag)+8 && string(e[:len(lineageTag)]) == lineageTag {
					lin.n = binary.BigEndian.Uint64(e[len(lineageTag):])
				}
			}
		}
		return ss, err
	}
	cfg.WrapSession = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
		if lin.n == 0 {
			lin.n = m.lineages.Add(1)
		}
		ss.Extra = append(ss.Extra, binary.BigEndian.AppendUint64([]byte(lineageTag), lin.n))
		return m.tickets.EncryptTicket(cs, ss)
	}
	return cfg
}

// wanted reports whether a CONNECT to host is intercepted: not a bypassed
// host, and the client did not say X-Proxyfleet-Mitm: off.
func (m *mitm) wanted(r *http.Request, host string) bool {
	return !leftAlone(r) && !m.bypass.Match(host)
}

// leftAlone reports a CONNECT whose client said X-Proxyfleet-Mitm: off:
// its tunnel is a plain one through a member, whatever it carries. The
// header's value was checked (checkMITMHeader).
func leftAlone(r *http.Request) bool {
	v := r.Header[HeaderMITM]
	return len(v) > 0 && strings.EqualFold(strings.TrimSpace(v[0]), "off")
}

// checkMITMHeader refuses an X-Proxyfleet-Mitm other than on or off: a
// client that writes "false" or "no" to keep a pinned site out of
// interception must hear that it was not understood, not have its
// tunnel intercepted.
func checkMITMHeader(r *http.Request) error {
	v := r.Header[HeaderMITM]
	for _, s := range v {
		s = strings.ToLower(strings.TrimSpace(s))
		if s != "on" && s != "off" {
			return &fault.Target{Reason: fault.ReasonBadRequest, Msg: HeaderMITM + " " + echo.Quote(s) + ": want on or off"}
		}
		if !strings.EqualFold(s, strings.TrimSpace(v[0])) {
			return &fault.Target{Reason: fault.ReasonBadRequest, Msg: HeaderMITM + " given twice, once on and once off"}
		}
	}
	return nil
}

// fingerprintOf is the site-facing handshake a CONNECT or a request inside
// a tunnel asks for with X-Proxyfleet-Fingerprint, else def.
func fingerprintOf(h http.Header, def Fingerprint) (Fingerprint, error) {
	v := h[HeaderFingerprint]
	if len(v) == 0 {
		return def, nil
	}
	fp, err := ParseFingerprint(strings.ToLower(strings.TrimSpace(v[0])))
	if err != nil {
		return "", &fault.Target{Reason: fault.ReasonBadRequest, Msg: HeaderFingerprint + ": " + err.Error()}
	}
	return fp, nil
}

// serveMITM answers a checked CONNECT itself, keeps the client's
// ClientHello, terminates the client's TLS with a leaf for host, and hands
// the connection to the inner server. No member is leased here: each
// request inside the tunnel leases (and may rotate) on its own, through
// the same path as plain HTTP.
func (rp *requestPath) serveMITM(w http.ResponseWriter, r *http.Request, p *params.Params, hostport, host string, port uint16, start time.Time) {
	rq := &request{w: w, start: start}
	rq.lr.target = rotation.HostKey(host) // the span's target; no lease is taken here
	fp, err := fingerprintOf(r.Header, rp.mitm.fp)
	if err != nil {
		rp.exit.finish(r.Context(), rq, err)
		return
	}
	c, ok := rp.takeTunnel(w, r, rq, mitmHello, true)
	if !ok {
		return
	}
	// The ClientHello is read here, kept, and handed on to the TLS server.
	read, record, err := mirror.ReadHello(c)
	c = &prefixConn{Conn: c, prefix: read}
	if err != nil {
		record = nil // the handshake fails on it and says why
	}
	var lin lineage
	tc := tls.Server(c, rp.mitm.serverConfig(host, fp, &lin))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), rp.dialTimeout)
	err = tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		_ = tc.Close()
		msg := err.Error()
		if strings.Contains(msg, "unknown certificate authority") || strings.Contains(msg, "bad certificate") ||
			strings.Contains(msg, "certificate unknown") {
			rp.log.Warn("a client refused the MITM certificate: does it trust the --mitm-ca-cert CA? (docs/mitm.md)", "target", host, "err", err)
		} else {
			rp.log.Debug("MITM handshake with the client failed", "target", host, "err", err)
		}
		rp.exit.ended(r.Context(), rq, fault.OutcomeClientGone, "")
		return
	}
	_ = tc.SetDeadline(time.Time{})
	st := tc.ConnectionState()
	rp.rec.MITMHandshake(LegClient, st.DidResume)
	t := &innerTunnel{p: *p, scheme: "https", hostport: hostport, host: host, port: port, fp: fp, record: record,
		lineage: lin.n, resumed: st.DidResume}
	if st.NegotiatedProtocol == "h2" {
		serveMITMH2(rp.inner, tc, t)
		return
	}
	rp.inner.serve(tc, t)
}

// siteResumption is where a mirroring tunnel's site connection through
// member keeps the site's sessions, and whether it offers one: only when
// the client resumed its session with the gateway. Nothing is kept for a
// client the gateway gave no ticket (it cannot resume).
func (t *innerTunnel) siteResumption(x *exchange, member string) mirror.Resumption {
	if t.lineage == 0 {
		return mirror.Resumption{}
	}
	return mirror.Resumption{Sessions: x.mitm.sites, Key: strconv.FormatUint(t.lineage, 10) + "\x00" + member, Offer: t.resumed}
}

// nextProtos is the ALPN the gateway offers a client: under mirror h2
// too, so a client that would speak HTTP/2 to the site does to the
// gateway, which then speaks it to the site the client's way.
func nextProtos(fp Fingerprint) []string {
	if fp == FingerprintMirror {
		return []string{"h2", "http/1.1"}
	}
	return []string{"http/1.1"}
}

// helloFor is the client's ClientHello to mirror, nil when it cannot be
// mirrored: the site then sees the fallback preset, which the log says once
// per tunnel.
func (t *innerTunnel) helloFor(x *exchange) *mirror.Hello {
	t.helloOnce.Do(func() {
		h, err := mirror.Parse(t.record)
		if err != nil {
			x.log.Info("cannot mirror the client's ClientHello: the site sees a browser preset instead",
				"target", t.host, "preset", x.mitm.preset.Name, "err", err)
			x.rec.MITMHelloFallback(FallbackUnmirrorable)
			return
		}
		t.hello = h
	})
	return t.hello
}
