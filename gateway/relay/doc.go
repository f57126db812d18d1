// Package relay carries the gateway's tunnels once they are up: a CONNECT
// or an upgraded WebSocket, two connections relayed both ways (splice(2)
// between two TCP connections on Linux, through pooled buffers otherwise),
// each direction giving its goroutine up while its source is idle (parked
// in an epoll set of its own, Linux) and the memory of a burst of parked
// tunnels given back to the system. It knows nothing of members, leases
// or requests: the gateway hands it the two connections and hears the
// bytes each way when the tunnel ends. Its tests need no gateway; the
// gateway's own tests check tunnels end to end.
package relay
