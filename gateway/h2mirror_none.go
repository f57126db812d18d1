//go:build nomirror

package gateway

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

// h2Print is what a client's first HTTP/2 frames said: none are read.
type h2Print struct{}

func (*h2Print) alps() []byte { return nil }

var goH2Print = &h2Print{}

// siteH2 is a site link's HTTP/2 connection: never opened.
type siteH2 struct{}

func (*h2Print) open(net.Conn) (*siteH2, error) { return nil, mirror.ErrLeftOut }

func (*siteH2) close()        {}
func (*siteH2) canTake() bool { return false }

func (*siteH2) roundTrip(*http.Request) (*http.Response, error) { return nil, mirror.ErrLeftOut }

func isNoCachedConn(error) bool { return false }

// serveMITMH2 is never called: HTTP/2 is not offered to the client.
func serveMITMH2(_ *inner, tc net.Conn, _ *innerTunnel) { _ = tc.Close() }
