//go:build nomirror

package gateway

import "net"

// serveMITMH2 is never called: HTTP/2 is not offered to the client.
func serveMITMH2(_ *inner, tc net.Conn, _ *innerTunnel) { _ = tc.Close() }
