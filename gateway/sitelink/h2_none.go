//go:build nomirror

package sitelink

import (
	"net"
	"net/http"

	"github.com/proxyfleet/proxyfleet/gateway/mirror"
)

// A build without mirroring (the tag nomirror: the lean sidecar) has no
// HTTP/2 towards sites: the gateway offers a MITM'd client HTTP/1.1 only
// (nextProtos) and reaches sites through the members' Transports, as
// --mitm-fingerprint go does, the only fingerprint ParseFingerprint
// accepts in it. Nothing here is reached.

// H2Print is what a client's first HTTP/2 frames said: none are read.
type H2Print struct{}

func (*H2Print) ALPS() []byte { return nil }

var GoH2Print = &H2Print{}

// H2Conn is a site link's HTTP/2 connection: never opened.
type H2Conn struct{}

func (*H2Print) Open(net.Conn) (*H2Conn, error) { return nil, mirror.ErrLeftOut }

func (*H2Conn) close()        {}
func (*H2Conn) canTake() bool { return false }

func (*H2Conn) roundTrip(*http.Request) (*http.Response, error) { return nil, mirror.ErrLeftOut }

func isNoCachedConn(error) bool { return false }
