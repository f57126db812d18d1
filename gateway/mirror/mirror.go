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
// offered. A ClientHello that cannot be mirrored (unparseable, with an
// extension uTLS cannot send or a key share it cannot make) is answered
// with a named browser preset instead (Presets), never with Go's own
// handshake. A mirrored handshake that uTLS cannot complete once the site
// answered (a group, a suite, a signature scheme it offered but cannot
// do) fails with an *OwnError, the gateway's failure and no one else's,
// and Closest names the presets to go on with.
//
// It imports bogdanfinn/utls and nothing of proxyfleet. Built with the tag
// nomirror (the lean sidecar, make sidecar) it links no uTLS: the reading
// of a ClientHello, the preset names and the types stay, and Available is
// false; the gateway then refuses --mitm-fingerprint mirror.
package mirror

import (
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
)

// MaxHello bounds a ClientHello read by ReadHello; a real one is under 2 KiB
// (Chromium's with a post-quantum key share).
const MaxHello = 16 << 10

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

// Preset is a named browser ClientHello from uTLS, for a crawler whose own
// cannot be mirrored.
type Preset struct {
	Name string
}

// presetNames are the presets, in the order docs/mitm.md lists them
// (presetIDs, in the mirroring build, says which uTLS hello each is).
var presetNames = []string{"chrome-133", "chrome-131", "firefox-120", "safari-16", "ios-16", "edge-85"}

// DefaultPreset is the preset a ClientHello that cannot be mirrored gets
// unless --mitm-fallback-preset names another: the most common browser.
const DefaultPreset = "chrome-133"

// Presets are the preset names, in the order docs/mitm.md lists them.
func Presets() []string { return slices.Clone(presetNames) }

// PresetByName returns the named preset.
func PresetByName(name string) (Preset, error) {
	if slices.Contains(presetNames, name) {
		return Preset{Name: name}, nil
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

// Conn is a site connection after its handshake.
type Conn interface {
	net.Conn
	// Resumed says whether the handshake resumed a kept session.
	Resumed() bool
	// Protocol is the ALPN protocol the site chose ("" none).
	Protocol() string
}

// OwnError is a site handshake that failed on the gateway's side: the TLS
// library could not build the ClientHello it was to send, or could not
// complete what that hello offered (a key share, a group, a cipher suite,
// a signature scheme, an extension) once the site answered it. Neither
// the site nor the member did anything wrong: the gateway built the hello.
// What the site or the member did (an alert from the site, a certificate
// that does not verify, a connection closed or reset) is never one.
type OwnError struct {
	// Reason is a short class of what failed, for a metric's label: one
	// of OwnReasons.
	Reason string
	Err    error
}

func (e *OwnError) Error() string { return e.Err.Error() }
func (e *OwnError) Unwrap() error { return e.Err }

// OwnReasons are the values of OwnError.Reason.
var OwnReasons = []string{"build", "key_share", "group", "cipher_suite", "signature", "version", "extension", "other"}
