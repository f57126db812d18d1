//go:build !nomirror

package mirror

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"

	utls "github.com/bogdanfinn/utls"
)

// Available says this build mirrors: it links uTLS.
const Available = true

// rawExtensions are the extensions uTLS has no type for that are copied as
// sent: each is honest to send from a client that does not act on it.
// post_handshake_auth (49) offers a client certificate after the
// handshake, which a site asking for one gets refused; encrypt_then_mac
// (22) only matters for TLS 1.2 CBC suites; trust_anchors (0xca34) lists
// the roots the client holds, which only steers the site's chain.
var rawExtensions = map[uint16]bool{22: true, 49: true, 0xca34: true}

// Hello is a crawler's ClientHello, ready to be mirrored. It keeps the
// record, not a parsed spec: uTLS writes per-connection state (key shares,
// GREASE values, the server name) into a spec's extensions, so each site
// connection gets a spec of its own (Spec).
type Hello struct {
	record []byte
	// ALPN is the crawler's ALPN list (nil when it sent none).
	ALPN []string
	// first is the spec Parse made, for the first Spec: most tunnels open
	// one site connection, which then costs one parse, not two.
	first atomic.Pointer[utls.ClientHelloSpec]
}

// Parse checks that record (as ReadHello returns it) can be mirrored.
func Parse(record []byte) (*Hello, error) {
	h := &Hello{record: record}
	spec, err := h.spec()
	if err != nil {
		return nil, err
	}
	for _, e := range spec.Extensions {
		if a, ok := e.(*utls.ALPNExtension); ok {
			h.ALPN = slices.Clone(a.AlpnProtocols)
		}
	}
	h.first.Store(spec)
	return h, nil
}

// spec parses the record afresh and vets every extension.
func (h *Hello) spec() (*utls.ClientHelloSpec, error) {
	unknown, err := unknownExtensions(h.record)
	if err != nil {
		return nil, err
	}
	for _, id := range unknown {
		if !rawExtensions[id] {
			return nil, fmt.Errorf("extension %d cannot be mirrored", id)
		}
	}
	var spec utls.ClientHelloSpec
	if err := spec.FromRaw(h.record, true); err != nil {
		return nil, err
	}
	grease := 0
	for _, e := range spec.Extensions {
		switch e := e.(type) {
		case *utls.UtlsGREASEExtension:
			grease++
		case *utls.KeyShareExtension:
			for _, s := range e.KeyShares {
				if !makesKeyShare(s.Group) {
					return nil, fmt.Errorf("a key share for group %d, which the gateway cannot make", s.Group)
				}
			}
		}
	}
	if grease > 2 {
		return nil, fmt.Errorf("%d GREASE extensions; at most 2 can be mirrored", grease)
	}
	return &spec, nil
}

// unknownExtensions lists the extension types in record uTLS has no type for.
func unknownExtensions(record []byte) ([]uint16, error) {
	if len(record) < 5+4+2+32+1 {
		return nil, errors.New("ClientHello cut short")
	}
	b := record[5+4+2+32:]
	skip := func(lenBytes int) bool {
		if len(b) < lenBytes {
			return false
		}
		n := 0
		for i := range lenBytes {
			n = n<<8 | int(b[i])
		}
		if len(b) < lenBytes+n {
			return false
		}
		b = b[lenBytes+n:]
		return true
	}
	if !skip(1) || !skip(2) || !skip(1) {
		return nil, errors.New("ClientHello cut short")
	}
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < 2 || len(b)-2 < int(binary.BigEndian.Uint16(b)) {
		return nil, errors.New("ClientHello extensions cut short")
	}
	b = b[2 : 2+int(binary.BigEndian.Uint16(b))]
	var out []uint16
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, errors.New("ClientHello extension cut short")
		}
		id := binary.BigEndian.Uint16(b)
		if utls.ExtensionFromID(id) == nil {
			out = append(out, id)
		}
		b = b[2:]
		if !skip(2) {
			return nil, fmt.Errorf("extension %d cut short", id)
		}
	}
	return out, nil
}

// Spec is a fresh ClientHelloSpec mirroring h for a connection to host,
// offering the protocols of h's ALPN list that speaks allows (speaks nil:
// all of them). The server name becomes host (left out for an IP address,
// as clients do). A pre-shared key is dropped unless offer: then it stays
// in its place for uTLS to fill from the session cache (left out when
// there is nothing to fill it with).
func (h *Hello) Spec(host string, speaks func(proto string) bool, offer bool) (*utls.ClientHelloSpec, error) {
	spec := h.first.Swap(nil)
	if spec == nil {
		var err error
		if spec, err = h.spec(); err != nil {
			return nil, err
		}
	}
	fitSpec(spec, host, speaks, offer)
	return spec, nil
}

// fitSpec points spec at host and trims its ALPN list to what speaks
// allows; a pre-shared key stays only if offer.
func fitSpec(spec *utls.ClientHelloSpec, host string, speaks func(proto string) bool, offer bool) {
	_, ipErr := netip.ParseAddr(host)
	isIP := ipErr == nil
	out := spec.Extensions[:0]
	last := len(spec.Extensions) - 1
	for i, e := range spec.Extensions {
		switch e := e.(type) {
		case *utls.SNIExtension:
			if isIP {
				continue
			}
			e.ServerName = host
		case utls.PreSharedKeyExtension:
			// The client's identities and binders are for the gateway's
			// session; uTLS writes the site's. Only in the last place, as
			// TLS 1.3 requires (uTLS panics on any other, and a hello the
			// gateway's own server accepted has it there).
			if offer && i == last {
				out = append(out, &utls.UtlsPreSharedKeyExtension{})
			}
			continue
		case *utls.ALPNExtension:
			if speaks != nil {
				e.AlpnProtocols = slices.DeleteFunc(slices.Clone(e.AlpnProtocols), func(p string) bool { return !speaks(p) })
				if len(e.AlpnProtocols) == 0 {
					e.AlpnProtocols = []string{"http/1.1"}
				}
			}
		}
		out = append(out, e)
	}
	spec.Extensions = out
}

// presetIDs are the uTLS hellos of the presets (presetNames).
var presetIDs = map[string]utls.ClientHelloID{
	"chrome-133":  utls.HelloChrome_133,
	"chrome-131":  utls.HelloChrome_131,
	"firefox-120": utls.HelloFirefox_120,
	"safari-16":   utls.HelloSafari_16_0,
	"ios-16":      utls.HelloIOS_16_0,
	"edge-85":     utls.HelloEdge_85,
}

// Sessions keeps the TLS sessions sites gave the gateway's mirrored
// connections, by lineage (Resumption.Key) and site, at most a fixed
// number, the least recently used dropped first. A session is taken when
// offered (used once, as TLS 1.3 asks of clients and browsers do); the
// connection that resumed it keeps the site's next one.
type Sessions struct {
	lru utls.ClientSessionCache
}

// NewSessions keeps at most capacity sessions.
func NewSessions(capacity int) *Sessions {
	return &Sessions{lru: utls.NewLRUClientSessionCache(capacity)}
}

// scoped is Sessions as one site connection's uTLS session cache: the
// site's name (uTLS's key) under the connection's lineage.
type scoped struct {
	s *Sessions
	r Resumption
}

func (c scoped) Get(site string) (*utls.ClientSessionState, bool) {
	if !c.r.Offer {
		return nil, false
	}
	k := c.r.Key + "\x00" + site
	cs, ok := c.s.lru.Get(k)
	if ok {
		c.s.lru.Put(k, nil) // single use
	}
	return cs, ok
}

func (c scoped) Put(site string, cs *utls.ClientSessionState) {
	c.s.lru.Put(c.r.Key+"\x00"+site, cs)
}

// Client performs the TLS handshake with the site over c as cfg says,
// verifying the site's certificate. On an error c is left to the caller;
// an *OwnError when the failure is the gateway's own (see OwnError).
func Client(ctx context.Context, c net.Conn, cfg Config) (Conn, error) {
	u, err := uclient(c, cfg)
	if err != nil {
		return nil, &OwnError{Reason: "build", Err: err}
	}
	if err := u.HandshakeContext(ctx); err != nil {
		if oe := own(err); oe != nil && ctx.Err() == nil {
			return nil, oe
		}
		return nil, err
	}
	return uconn{u}, nil
}

// uconn is a uTLS connection as a Conn.
type uconn struct{ *utls.UConn }

func (u uconn) Resumed() bool    { return u.ConnectionState().DidResume }
func (u uconn) Protocol() string { return u.ConnectionState().NegotiatedProtocol }

// uclient is a uTLS client over c with cfg's ClientHello applied.
func uclient(c net.Conn, cfg Config) (*utls.UConn, error) {
	var spec *utls.ClientHelloSpec
	if cfg.Hello != nil {
		var err error
		if spec, err = cfg.Hello.Spec(cfg.Host, cfg.Speaks, cfg.Resumption.Offer); err != nil {
			return nil, err
		}
	} else {
		id, ok := presetIDs[cfg.Preset.Name]
		if !ok {
			return nil, fmt.Errorf("unknown ClientHello preset %q", cfg.Preset.Name)
		}
		s, err := utls.UTLSIdToSpec(id)
		if err != nil {
			return nil, fmt.Errorf("the %s ClientHello: %w", cfg.Preset.Name, err)
		}
		spec = &s
		fitSpec(spec, cfg.Host, cfg.Speaks, cfg.Resumption.Offer)
	}
	tc := &utls.Config{ServerName: cfg.Host, RootCAs: cfg.Roots, MinVersion: utls.VersionTLS12, ApplicationSettings: cfg.ApplicationSettings}
	if r := cfg.Resumption; r.Sessions != nil {
		tc.ClientSessionCache = scoped{s: r.Sessions, r: r}
		// Nothing kept: the pre-shared key is left out, as a client with no
		// session leaves it out; a hello without one skips resumption.
		tc.OmitEmptyPsk = true
		tc.PreferSkipResumptionOnNilExtension = true
	}
	keys, err := ownKeyShares(spec, tc.Rand)
	if err != nil {
		return nil, fmt.Errorf("building the site's ClientHello: %w", err)
	}
	var sc *shareConn
	if keys != nil {
		sc = &shareConn{Conn: c}
		c = sc
	}
	u := utls.UClient(c, tc, utls.HelloCustom, false, false, true)
	if err := u.ApplyPreset(spec); err != nil {
		return nil, fmt.Errorf("building the site's ClientHello: %w", err)
	}
	if keys != nil {
		ks := u.HandshakeState.State13.KeyShareKeys
		ks.Ecdhe = keys.first
		sc.chosen = func(g utls.CurveID) {
			if k := keys.by[g]; k != nil {
				ks.Ecdhe = k
			}
		}
	}
	return u, nil
}

// shareKeys are the gateway's private keys for the classical (ECDHE) key
// shares of a hello that sends more than one.
type shareKeys struct {
	first *ecdh.PrivateKey // the first share's: uTLS's until the server chooses
	by    map[utls.CurveID]*ecdh.PrivateKey
}

// ownKeyShares fills in the key shares of spec with keys of the gateway's
// own when it sends more than one classical (ECDHE) share, and returns
// their private keys; nil when it sends one or none (uTLS makes that key
// itself). uTLS keeps the private key of the first classical share only,
// so a site that takes another the client offered (GnuTLS sends P-256 and
// then x25519; a Go or OpenSSL site takes x25519) failed the handshake with
// "tls: invalid server key share". Hybrid shares (X25519MLKEM768) stay
// uTLS's, which keeps their keys apart.
func ownKeyShares(spec *utls.ClientHelloSpec, rnd io.Reader) (*shareKeys, error) {
	var ks *utls.KeyShareExtension
	for _, e := range spec.Extensions {
		if k, ok := e.(*utls.KeyShareExtension); ok {
			ks = k
		}
	}
	if ks == nil {
		return nil, nil
	}
	classical := 0
	for _, s := range ks.KeyShares {
		if _, ok := ecdhCurve(s.Group); ok {
			classical++
		}
	}
	if classical < 2 {
		return nil, nil
	}
	if rnd == nil {
		rnd = rand.Reader
	}
	keys := &shareKeys{by: map[utls.CurveID]*ecdh.PrivateKey{}}
	for i, s := range ks.KeyShares {
		curve, ok := ecdhCurve(s.Group)
		if !ok {
			continue
		}
		if keys.by[s.Group] != nil {
			return nil, fmt.Errorf("two key shares for group %d", s.Group)
		}
		k, err := curve.GenerateKey(rnd)
		if err != nil {
			return nil, err
		}
		keys.by[s.Group] = k
		if keys.first == nil {
			keys.first = k
		}
		// A share with data is left alone by uTLS.
		ks.KeyShares[i].Data = k.PublicKey().Bytes()
	}
	return keys, nil
}

// makesKeyShare reports a key-share group uTLS makes a key for: the
// classical curves and the X25519 hybrids. (Go 1.26 clients list
// SecP256r1MLKEM768 and may send a share for it; uTLS has no such key.)
func makesKeyShare(g utls.CurveID) bool {
	_, classical := ecdhCurve(g)
	return classical || isGrease(uint16(g)) || g == utls.X25519MLKEM768 || g == utls.X25519Kyber768Draft00
}

// ecdhCurve is the ECDHE curve of a classical key-share group.
func ecdhCurve(g utls.CurveID) (ecdh.Curve, bool) {
	switch g {
	case utls.X25519:
		return ecdh.X25519(), true
	case utls.CurveP256:
		return ecdh.P256(), true
	case utls.CurveP384:
		return ecdh.P384(), true
	case utls.CurveP521:
		return ecdh.P521(), true
	}
	return nil, false
}

// shareConn is a site connection whose hello sent several classical key
// shares: it reads the site's ServerHello as it passes (it is not
// encrypted) and, before uTLS computes the shared secret from it, points
// uTLS at the private key of the share the site chose. uTLS reads the
// ServerHello on the handshake's goroutine, which calls Read, so chosen
// runs there, before uTLS takes its key.
type shareConn struct {
	net.Conn
	chosen func(utls.CurveID)
	seen   []byte // what was read, until the ServerHello is whole
	done   bool
}

func (c *shareConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && n > 0 {
		c.seen = append(c.seen, p[:n]...)
		if g, whole := serverShare(c.seen); whole || len(c.seen) > maxServerHello {
			c.done, c.seen = true, nil
			if g != 0 {
				c.chosen(g)
			}
		}
	}
	return n, err
}

// maxServerHello bounds what shareConn keeps while it waits for the
// ServerHello (a real one is under 200 bytes; a post-quantum one about
// 1.2 KiB): past it uTLS refuses the message anyway.
const maxServerHello = 64 << 10

// helloRetryRandom is the random of a HelloRetryRequest (RFC 8446 4.1.3).
var helloRetryRandom = []byte{
	0xCF, 0x21, 0xAD, 0x74, 0xE5, 0x9A, 0x61, 0x11, 0xBE, 0x1D, 0x8C, 0x02, 0x1E, 0x65, 0xB8, 0x91,
	0xC2, 0xA2, 0x11, 0x16, 0x7A, 0xBB, 0x8C, 0x5E, 0x07, 0x9E, 0x09, 0xE2, 0xC8, 0xA8, 0x33, 0x9C,
}

// serverShare reads the group of the key share in the ServerHello at the
// start of b (the site's first bytes, TLS records): whole is false until
// the message is; the group is 0 when there is none to take (a TLS 1.2
// ServerHello, a HelloRetryRequest, which uTLS answers with a key of its
// own, or bytes that are not a ServerHello, which uTLS refuses itself).
func serverShare(b []byte) (group utls.CurveID, whole bool) {
	var msg []byte
	for len(b) > 0 {
		if len(b) < 5 {
			return 0, false
		}
		if b[0] != 22 {
			return 0, true
		}
		n := int(binary.BigEndian.Uint16(b[3:]))
		if len(b) < 5+n {
			return 0, false
		}
		msg = append(msg, b[5:5+n]...)
		b = b[5+n:]
		if len(msg) >= 4 {
			if msg[0] != 2 {
				return 0, true
			}
			need := 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
			if len(msg) >= need {
				return keyShareOf(msg[4:need]), true
			}
		}
	}
	return 0, false
}

// keyShareOf is the key share's group in a ServerHello's body, 0 when it
// has none or is a HelloRetryRequest.
func keyShareOf(body []byte) utls.CurveID {
	if len(body) < 2+32+1 || bytes.Equal(body[2:34], helloRetryRandom) {
		return 0
	}
	b := body[34:]
	sid := int(b[0])
	if len(b) < 1+sid+2+1+2 {
		return 0
	}
	b = b[1+sid+2+1:]
	el := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	if len(b) < el {
		return 0
	}
	b = b[:el]
	for len(b) >= 4 {
		typ, n := binary.BigEndian.Uint16(b), int(binary.BigEndian.Uint16(b[2:]))
		if len(b) < 4+n {
			return 0
		}
		if typ == 51 && n >= 2 {
			return utls.CurveID(binary.BigEndian.Uint16(b[4:]))
		}
		b = b[4+n:]
	}
	return 0
}

// Built returns the ClientHello handshake message Client would send for
// cfg, without a connection: for tests and benchmarks of the mirroring.
func Built(cfg Config) ([]byte, error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	u, err := uclient(a, cfg)
	if err != nil {
		return nil, err
	}
	if err := u.BuildHandshakeState(); err != nil {
		return nil, err
	}
	return bytes.Clone(u.HandshakeState.Hello.Raw), nil
}
