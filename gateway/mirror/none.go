//go:build nomirror

package mirror

import (
	"context"
	"errors"
	"net"
)

// Available says this build does not mirror: it was built with the tag
// nomirror and links no uTLS.
const Available = false

// ErrLeftOut is what mirroring answers in a build without it; the gateway
// refuses --mitm-fingerprint mirror before anything reaches it.
var ErrLeftOut = errors.New("this build leaves ClientHello mirroring out (built with the tag nomirror)")

// Hello is a crawler's ClientHello; without mirroring none is parsed.
type Hello struct{}

// Parse refuses: see ErrLeftOut.
func Parse([]byte) (*Hello, error) { return nil, ErrLeftOut }

// Sessions keeps no session without mirroring.
type Sessions struct{}

// NewSessions returns nil: without mirroring no site session is kept.
func NewSessions(int) *Sessions { return nil }

// Client refuses: see ErrLeftOut.
func Client(context.Context, net.Conn, Config) (Conn, error) { return nil, ErrLeftOut }

// Closest is def alone: without mirroring no hello is compared.
func Closest(_ *Hello, def Preset) []Preset { return []Preset{def} }

// JA3 is empty: without mirroring no hello is read.
func (*Hello) JA3() string { return "" }
