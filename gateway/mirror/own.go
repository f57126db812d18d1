//go:build !nomirror

package mirror

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	utls "github.com/bogdanfinn/utls"
)

// own classifies a failed site handshake: nil when the site or the member
// caused it (or the caller gave up), else the OwnError saying what of the
// gateway's hello failed. uTLS reports a site's alert as a net.OpError
// "remote error", its own refusal of the site's answer as a "local error"
// (an alert it sent) or as a plain error; reading and writing fail as
// net.OpErrors of their own or io.EOF.
func own(err error) *OwnError {
	var (
		oe  *net.OpError
		cve *utls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &oe) && oe.Op != "local error":
		return nil // the site's alert, or the connection's failure
	case errors.As(err, &cve), isX509(err):
		return nil
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return nil
	}
	return &OwnError{Reason: ownReason(err.Error()), Err: err}
}

// isX509 reports a certificate verification error the TLS library did not
// wrap in its own type.
func isX509(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if strings.HasPrefix(e.Error(), "x509: ") {
			return true
		}
	}
	return false
}

// ownReason classes a uTLS error by its words (uTLS has no error types
// for them): which part of the hello the library could not complete.
func ownReason(msg string) string {
	switch {
	case strings.Contains(msg, "key share"), strings.Contains(msg, "key_share"):
		return "key_share"
	case strings.Contains(msg, "group"), strings.Contains(msg, "curve"):
		return "group"
	case strings.Contains(msg, "cipher suite"):
		return "cipher_suite"
	case strings.Contains(msg, "signature"):
		return "signature"
	case strings.Contains(msg, "version"):
		return "version"
	case strings.Contains(msg, "extension"):
		return "extension"
	}
	return "other"
}

// Closest are the presets ordered by how close each one's ClientHello is
// to h's (cipher suites, extensions and groups in common), the closest
// first, def first among equals: the hello a client falls back to when its
// own cannot be completed with a site. Without h (nil) def comes first,
// then the others in their listed order.
func Closest(h *Hello, def Preset) []Preset {
	if h == nil {
		return append([]Preset{def}, others(def)...)
	}
	spec, err := h.spec()
	if err != nil {
		return append([]Preset{def}, others(def)...)
	}
	client := featuresOf(spec)
	type scored struct {
		p     Preset
		score float64
	}
	var all []scored
	for _, name := range presetNames {
		f, ok := presetFeatures(name)
		if !ok {
			continue
		}
		all = append(all, scored{Preset{name}, jaccard(client.suites, f.suites) + jaccard(client.exts, f.exts) + jaccard(client.groups, f.groups)})
	}
	slices.SortStableFunc(all, func(a, b scored) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		case a.p == def:
			return -1
		case b.p == def:
			return 1
		}
		return 0
	})
	out := make([]Preset, len(all))
	for i, s := range all {
		out[i] = s.p
	}
	return out
}

// others are the presets but p, in their listed order.
func others(p Preset) []Preset {
	var out []Preset
	for _, n := range presetNames {
		if n != p.Name {
			out = append(out, Preset{n})
		}
	}
	return out
}

// features are what Closest compares of a hello, GREASE left out.
type features struct {
	suites, exts, groups []uint16
}

func featuresOf(spec *utls.ClientHelloSpec) features {
	var f features
	for _, s := range spec.CipherSuites {
		if !isGrease(s) {
			f.suites = append(f.suites, s)
		}
	}
	for _, e := range spec.Extensions {
		switch e := e.(type) {
		case *utls.UtlsGREASEExtension:
			continue
		case *utls.SupportedCurvesExtension:
			for _, c := range e.Curves {
				if !isGrease(uint16(c)) {
					f.groups = append(f.groups, uint16(c))
				}
			}
		}
		if id, ok := extensionID(e); ok {
			f.exts = append(f.exts, id)
		}
	}
	return f
}

// extensionID is the type of e, read from its encoding.
func extensionID(e utls.TLSExtension) (uint16, bool) {
	n := e.Len()
	if n < 4 {
		return 0, false
	}
	b := make([]byte, n)
	if _, err := e.Read(b); err != nil && !errors.Is(err, io.EOF) {
		return 0, false
	}
	return uint16(b[0])<<8 | uint16(b[1]), true
}

func isGrease(v uint16) bool { return v&0x0f0f == 0x0a0a && v>>8 == v&0xff }

// jaccard is |a∩b| / |a∪b| of two sets of values (1 when both are empty).
func jaccard(a, b []uint16) float64 {
	in := map[uint16]int{}
	for _, v := range a {
		in[v] |= 1
	}
	for _, v := range b {
		in[v] |= 2
	}
	if len(in) == 0 {
		return 1
	}
	both := 0
	for _, m := range in {
		if m == 3 {
			both++
		}
	}
	return float64(both) / float64(len(in))
}

var (
	presetFeaturesOnce sync.Once
	presetFeaturesBy   map[string]features
)

// presetFeatures are a preset's features, computed once.
func presetFeatures(name string) (features, bool) {
	presetFeaturesOnce.Do(func() {
		presetFeaturesBy = map[string]features{}
		for n, id := range presetIDs {
			spec, err := utls.UTLSIdToSpec(id)
			if err != nil {
				continue
			}
			presetFeaturesBy[n] = featuresOf(&spec)
		}
	})
	f, ok := presetFeaturesBy[name]
	return f, ok
}

// JA3 is the JA3 hash of h (MD5 of version, cipher suites, extensions,
// groups and point formats, GREASE left out): what an operator searches
// a fingerprint database or a site's logs for.
func (h *Hello) JA3() string {
	spec, err := h.spec()
	if err != nil || len(h.record) < 11 {
		return ""
	}
	f := featuresOf(spec)
	var points []uint16
	for _, e := range spec.Extensions {
		if p, ok := e.(*utls.SupportedPointsExtension); ok {
			for _, v := range p.SupportedPoints {
				points = append(points, uint16(v))
			}
		}
	}
	join := func(vs []uint16) string {
		s := make([]string, len(vs))
		for i, v := range vs {
			s[i] = strconv.Itoa(int(v))
		}
		return strings.Join(s, "-")
	}
	ver := uint16(h.record[9])<<8 | uint16(h.record[10])
	sum := md5.Sum([]byte(strconv.Itoa(int(ver)) + "," + join(f.suites) + "," + join(f.exts) + "," + join(f.groups) + "," + join(points)))
	return hex.EncodeToString(sum[:])
}
