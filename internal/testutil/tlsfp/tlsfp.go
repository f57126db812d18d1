// Package tlsfp is the tests' own TLS ClientHello parser: a hello read off
// the wire (ReadClientHello) field by field (ParseClientHello) and its
// JA3, JA4 and shape fingerprints, written from the RFCs and the JA3/JA4
// definitions, so a test can judge the hello the gateway sends a site.
//
// It imports the standard library only and must not import anything of
// ours, the gateway's own hello code least of all: a parser shared with the
// code under test would agree with its mistakes.
package tlsfp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// HelloPrint is a ClientHello read from its raw bytes, field by field, the
// way a site fingerprints a client. GREASE values (RFC 8701) are kept where
// the client put them, as GreaseValue, so two hellos compare equal when
// their GREASE sits in the same places whatever the random values were.
//
// It is the tests' own parser, written from the RFCs and the JA3/JA4
// definitions, independent of the gateway's.
type HelloPrint struct {
	// Version is the legacy_version field.
	Version uint16
	// SessionIDLen is the legacy_session_id's length (its bytes are random).
	SessionIDLen int
	CipherSuites []uint16
	Compression  []byte
	// Extensions are the extension types in the order sent.
	Extensions        []uint16
	ServerName        string
	Groups            []uint16
	PointFormats      []byte
	SignatureAlgs     []uint16
	ALPN              []string
	SupportedVersions []uint16
	KeyShareGroups    []uint16
	PSKModes          []byte
	CertCompression   []uint16
	RecordSizeLimit   int // -1 when absent
	// Length is the handshake message's length (padding makes it fixed).
	Length int
}

// GreaseValue stands for every GREASE value in a HelloPrint.
const GreaseValue = 0x0a0a

func isGrease(v uint16) bool { return v&0x0f0f == 0x0a0a && v>>8 == v&0xff }

func ungrease(v uint16) uint16 {
	if isGrease(v) {
		return GreaseValue
	}
	return v
}

// ReadClientHello reads one ClientHello from r: TLS records until the
// handshake message is whole. It returns the bytes read and the handshake
// message (type, length and body).
func ReadClientHello(r io.Reader) (read, msg []byte, err error) {
	var hdr [5]byte
	need := -1
	for need < 0 || len(msg) < need {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return read, nil, err
		}
		read = append(read, hdr[:]...)
		if hdr[0] != 22 {
			return read, nil, fmt.Errorf("record type %d, want a handshake (22)", hdr[0])
		}
		n := int(binary.BigEndian.Uint16(hdr[3:]))
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return read, nil, err
		}
		read = append(read, body...)
		msg = append(msg, body...)
		if need < 0 && len(msg) >= 4 {
			if msg[0] != 1 {
				return read, nil, fmt.Errorf("handshake type %d, want a ClientHello (1)", msg[0])
			}
			need = 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
		}
	}
	return read, msg[:need], nil
}

type rd struct {
	b   []byte
	err error
}

func (r *rd) n(k int) []byte {
	if r.err != nil || len(r.b) < k {
		r.err = errors.New("ClientHello cut short")
		return nil
	}
	v := r.b[:k]
	r.b = r.b[k:]
	return v
}
func (r *rd) u8() int  { v := r.n(1); return int(at(v, 0)) }
func (r *rd) u16() int { v := r.n(2); return int(at(v, 0))<<8 | int(at(v, 1)) }
func (r *rd) vec8() *rd {
	return &rd{b: r.n(r.u8()), err: r.err}
}
func (r *rd) vec16() *rd {
	return &rd{b: r.n(r.u16()), err: r.err}
}
func (r *rd) u16s() []uint16 {
	var out []uint16
	for len(r.b) >= 2 && r.err == nil {
		out = append(out, ungrease(uint16(r.u16())))
	}
	return out
}

func at(b []byte, i int) byte {
	if i < len(b) {
		return b[i]
	}
	return 0
}

// ParseClientHello reads a ClientHello handshake message (as
// ReadClientHello returns it).
func ParseClientHello(msg []byte) (*HelloPrint, error) {
	r := &rd{b: msg}
	if r.u8() != 1 {
		return nil, errors.New("not a ClientHello")
	}
	r.n(3)
	h := &HelloPrint{Length: len(msg), RecordSizeLimit: -1}
	h.Version = uint16(r.u16())
	r.n(32)
	h.SessionIDLen = len(r.vec8().b)
	h.CipherSuites = r.vec16().u16s()
	h.Compression = r.vec8().b
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) == 0 {
		return h, nil
	}
	exts := r.vec16()
	for len(exts.b) > 0 && exts.err == nil {
		typ := uint16(exts.u16())
		body := exts.vec16()
		h.Extensions = append(h.Extensions, ungrease(typ))
		switch typ {
		case 0:
			list := body.vec16()
			if list.u8() == 0 {
				h.ServerName = string(list.vec16().b)
			}
		case 10:
			h.Groups = body.vec16().u16s()
		case 11:
			h.PointFormats = body.vec8().b
		case 13:
			h.SignatureAlgs = body.vec16().u16s()
		case 16:
			list := body.vec16()
			for len(list.b) > 0 && list.err == nil {
				h.ALPN = append(h.ALPN, string(list.vec8().b))
			}
		case 43:
			h.SupportedVersions = body.vec8().u16s()
		case 51:
			list := body.vec16()
			for len(list.b) > 0 && list.err == nil {
				h.KeyShareGroups = append(h.KeyShareGroups, ungrease(uint16(list.u16())))
				list.vec16()
			}
		case 45:
			h.PSKModes = body.vec8().b
		case 27:
			h.CertCompression = body.vec8().u16s()
		case 28:
			h.RecordSizeLimit = body.u16()
		}
		if body.err != nil {
			return nil, fmt.Errorf("extension %d: %w", typ, body.err)
		}
	}
	if exts.err != nil {
		return nil, exts.err
	}
	return h, nil
}

func joinU16(vs []uint16, sep string, hexa bool) string {
	parts := make([]string, 0, len(vs))
	for _, v := range vs {
		if hexa {
			parts = append(parts, fmt.Sprintf("%04x", v))
		} else {
			parts = append(parts, strconv.Itoa(int(v)))
		}
	}
	return strings.Join(parts, sep)
}

func dropGrease(vs []uint16) []uint16 {
	return slices.DeleteFunc(slices.Clone(vs), func(v uint16) bool { return v == GreaseValue })
}

// JA3String is the JA3 fingerprint's input: version, ciphers, extensions,
// groups and point formats, GREASE left out as JA3 defines.
func (h *HelloPrint) JA3String() string {
	pf := make([]uint16, len(h.PointFormats))
	for i, b := range h.PointFormats {
		pf[i] = uint16(b)
	}
	return strings.Join([]string{strconv.Itoa(int(h.Version)), joinU16(dropGrease(h.CipherSuites), "-", false),
		joinU16(dropGrease(h.Extensions), "-", false), joinU16(dropGrease(h.Groups), "-", false), joinU16(pf, "-", false)}, ",")
}

// JA3N is JA3's input with the extensions sorted: Chromium shuffles its
// extension order per connection, so JA3 itself differs between two of its
// handshakes and this does not.
func (h *HelloPrint) JA3N() string {
	c := *h
	c.Extensions = slices.Sorted(slices.Values(h.Extensions))
	return c.JA3String()
}

// JA4 is the JA4 TLS client fingerprint (FoxIO's definition):
// t<version><sni d|i><ciphers><extensions><alpn>_<ciphers hash>_<extensions+sigalgs hash>.
func (h *HelloPrint) JA4() string {
	ver := h.Version
	if sv := dropGrease(h.SupportedVersions); len(sv) > 0 {
		ver = slices.Max(sv)
	}
	vs := map[uint16]string{0x0304: "13", 0x0303: "12", 0x0302: "11", 0x0301: "10", 0x0300: "s3"}[ver]
	if vs == "" {
		vs = "00"
	}
	sni := "i"
	if slices.Contains(h.Extensions, 0) {
		sni = "d"
	}
	ciphers := dropGrease(h.CipherSuites)
	exts := dropGrease(h.Extensions)
	alpn := "00"
	if len(h.ALPN) > 0 && h.ALPN[0] != "" {
		a := h.ALPN[0]
		alpn = a[:1] + a[len(a)-1:]
	}
	a := fmt.Sprintf("t%s%s%02d%02d%s", vs, sni, min(len(ciphers), 99), min(len(exts), 99), alpn)
	hash := func(s string) string {
		if s == "" {
			return "000000000000"
		}
		sum := sha256.Sum256([]byte(s))
		return hex.EncodeToString(sum[:])[:12]
	}
	b := hash(joinU16(slices.Sorted(slices.Values(ciphers)), ",", true))
	rest := slices.DeleteFunc(slices.Clone(exts), func(v uint16) bool { return v == 0 || v == 16 })
	slices.Sort(rest)
	c := joinU16(rest, ",", true)
	if sa := dropGrease(h.SignatureAlgs); len(sa) > 0 {
		c += "_" + joinU16(sa, ",", true)
	}
	return a + "_" + b + "_" + hash(c)
}

// Shape is everything a site can compare of the hello but its random
// values and extension order: ciphers in order, the sorted extension set,
// groups, key-share groups, signature algorithms, point formats, ALPN,
// versions, PSK modes, certificate compression and record size limit.
func (h *HelloPrint) Shape() string {
	return fmt.Sprintf("ver=%04x sid=%d ciphers=%s comp=%x exts=%s groups=%s keyshare=%s sigalgs=%s points=%x alpn=%s versions=%s pskmodes=%x certcomp=%s rsl=%d",
		h.Version, h.SessionIDLen, joinU16(h.CipherSuites, ",", true), h.Compression,
		joinU16(slices.Sorted(slices.Values(h.Extensions)), ",", true), joinU16(h.Groups, ",", true),
		joinU16(h.KeyShareGroups, ",", true), joinU16(h.SignatureAlgs, ",", true), h.PointFormats,
		strings.Join(h.ALPN, ","), joinU16(h.SupportedVersions, ",", true), h.PSKModes,
		joinU16(h.CertCompression, ",", true), h.RecordSizeLimit)
}
