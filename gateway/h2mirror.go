//go:build !nomirror

package gateway

import (
	"net"

	"github.com/proxyfleet/proxyfleet/gateway/sitelink"
)

// serveMITMH2 hands a client that chose h2 to the MITM server once its
// first frames are read and kept for the tunnel's site connections; every
// stream is then a request served as serveInnerRequest serves one over
// HTTP/1.1.
func serveMITMH2(in *inner, tc net.Conn, t *innerTunnel) {
	t.speaksH2 = true
	in.serve(&sitelink.Tap{Conn: tc, Print: &t.h2}, t)
}
