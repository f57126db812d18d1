// Package mirror makes the gateway's TLS handshake with a site look like
// the crawler's: it reads the ClientHello a crawler sent to the gateway's
// MITM side and sends the site one built from it with uTLS
// (github.com/bogdanfinn/utls): the same cipher suites, extensions, groups,
// key-share groups, signature algorithms, ALPN list and the rest, in the
// same order, with GREASE where the crawler put it.
//
// What cannot be mirrored honestly is left out or regenerated: key shares
// and the random are the gateway's own; a pre-shared key (a session the
// crawler resumes with the gateway means nothing to the site) is replaced
// by one of the gateway's own sessions with the site when the caller
// offers one (Resumption), and dropped otherwise; an ECH extension is sent
// as GREASE; a session ticket is sent empty unless a kept session is
// offered. A ClientHello that cannot be mirrored (unparseable, or with an
// extension uTLS cannot send) is answered with a named browser preset
// instead (Presets), never with Go's own handshake.
//
// It imports bogdanfinn/utls and nothing of proxyfleet.
package mirror

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"

	utls "github.com/bogdanfinn/utls"
)

// MaxHello bounds a ClientHello read by ReadHello; a real one is under 2 KiB
// (Chromium's with a post-quantum key share).
const MaxHello = 16 << 10

// rawExtensions are the extensions uTLS has no type for that are copied as
// sent: each is honest to send from a client that does not act on it.
// post_handshake_auth (49) offers a client certificate after the
// handshake, which a site asking for one gets refused; encrypt_then_mac
// (22) only matters for TLS 1.2 CBC suites; trust_anchors (0xca34) lists
// the roots the client holds, which only steers the site's chain.
var rawExtensions = map[uint16]bool{22: true, 49: true, 0xca34: true}

// ReadHello reads TLS records from r until one ClientHello handshake
// message is whole. It returns every byte read (to hand on to the TLS
// server) and the message as one handshake record, which Parse takes.
func ReadHello(r io.Reader) (read, record []byte, err error) {
	var hdr [5]byte
	var msg []byte
	need := -1
	for need < 0 || len(msg) < need {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return read, nil, fmt.Errorf("reading the ClientHello: %w", err)
		}
		read = append(read, hdr[:]...)
		if hdr[0] != 22 {
			return read, nil, fmt.Errorf("not a TLS handshake: record type %d", hdr[0])
		}
		n := int(binary.BigEndian.Uint16(hdr[3:]))
		if len(read)+n > MaxHello {
			return read, nil, fmt.Errorf("ClientHello longer than %d bytes", MaxHello)
		}
		start := len(read)
		read = append(read, make([]byte, n)...)
		if _, err := io.ReadFull(r, read[start:]); err != nil {
			return read, nil, fmt.Errorf("reading the ClientHello: %w", err)
		}
		msg = append(msg, read[start:]...)
		if need < 0 && len(msg) >= 4 {
			if msg[0] != 1 {
				return read, nil, fmt.Errorf("not a ClientHello: handshake type %d", msg[0])
			}
			need = 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
			if need > MaxHello {
				return read, nil, fmt.Errorf("ClientHello longer than %d bytes", MaxHello)
			}
		}
	}
	record = make([]byte, 5, 5+need)
	record[0] = 22
	copy(record[1:3], read[1:3]) // the first record's version
	binary.BigEndian.PutUint16(record[3:], uint16(need))
	return read, append(record, msg[:need]...), nil
}

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
		if _, ok := e.(*utls.UtlsGREASEExtension); ok {
			grease++
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

// Preset is a named browser ClientHello from uTLS, for a crawler whose own
// cannot be mirrored.
type Preset struct {
	Name string
	id   utls.ClientHelloID
}

var presets = []Preset{
	{"chrome-133", utls.HelloChrome_133},
	{"chrome-131", utls.HelloChrome_131},
	{"firefox-120", utls.HelloFirefox_120},
	{"safari-16", utls.HelloSafari_16_0},
	{"ios-16", utls.HelloIOS_16_0},
	{"edge-85", utls.HelloEdge_85},
}

// DefaultPreset is the preset a ClientHello that cannot be mirrored gets
// unless --mitm-fallback-preset names another: the most common browser.
const DefaultPreset = "chrome-133"

// Presets are the preset names, in the order docs/mitm.md lists them.
func Presets() []string {
	names := make([]string, len(presets))
	for i, p := range presets {
		names[i] = p.Name
	}
	return names
}

// PresetByName returns the named preset.
func PresetByName(name string) (Preset, error) {
	for _, p := range presets {
		if p.Name == name {
			return p, nil
		}
	}
	return Preset{}, fmt.Errorf("unknown ClientHello preset %s (want one of %v)", strconv.Quote(name), Presets())
}

// Config is one site-facing handshake.
type Config struct {
	// Host is the site's name or IP address, checked against its certificate.
	Host string
	// Roots verify the site's certificate (nil: the system's).
	Roots *x509.CertPool
	// Hello is the crawler's ClientHello; nil sends Preset's.
	Hello *Hello
	// Preset is used when Hello is nil.
	Preset Preset
	// Speaks reports whether the gateway can speak an ALPN protocol to the
	// site; offered protocols it cannot are left out.
	Speaks func(proto string) bool
	// ApplicationSettings are the ALPS data sent, by ALPN protocol, when
	// the site negotiates ALPS (Chromium sends its HTTP/2 SETTINGS for h2).
	ApplicationSettings map[string][]byte
	// Resumption keeps the sessions the site gives this connection and
	// says whether one kept before is offered to it.
	Resumption Resumption
}

// Resumption is where a site connection's TLS sessions are kept, and
// whether one is offered: the site leg resumes when, and only when, the
// crawler resumed its own session with the gateway (Offer), with the
// session the site gave a connection made for that same crawler session
// through the same member (Key). So a site can link two connections only
// where the crawler linked them itself, and never sees one ticket from two
// egress addresses.
type Resumption struct {
	// Sessions keeps the sessions; nil: none kept, none offered.
	Sessions *Sessions
	// Key names the lineage: the crawler's session with the gateway and
	// the member (the site's name is added to it).
	Key string
	// Offer offers the lineage's kept session for the site, if there is one.
	Offer bool
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
// verifying the site's certificate. On an error c is left to the caller.
func Client(ctx context.Context, c net.Conn, cfg Config) (*utls.UConn, error) {
	u, err := uclient(c, cfg)
	if err != nil {
		return nil, err
	}
	if err := u.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	return u, nil
}

// uclient is a uTLS client over c with cfg's ClientHello applied.
func uclient(c net.Conn, cfg Config) (*utls.UConn, error) {
	var spec *utls.ClientHelloSpec
	if cfg.Hello != nil {
		var err error
		if spec, err = cfg.Hello.Spec(cfg.Host, cfg.Speaks, cfg.Resumption.Offer); err != nil {
			return nil, err
		}
	} else {
		s, err := utls.UTLSIdToSpec(cfg.Preset.id)
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
	u := utls.UClient(c, tc, utls.HelloCustom, false, false, true)
	if err := u.ApplyPreset(spec); err != nil {
		return nil, fmt.Errorf("building the site's ClientHello: %w", err)
	}
	return u, nil
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
