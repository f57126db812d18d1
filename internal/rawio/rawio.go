// Package rawio reads and writes a connected socket with raw system calls
// (syscall.RawSyscall inside the connection's syscall.RawConn), without the
// runtime's entersyscall and exitsyscall around each read and write.
//
// Why: a proxy's request path is a few short non-blocking reads and writes
// per request. Through net.Conn each is a runtime "system call", and
// entering one wakes the runtime's monitor thread (sysmon) whenever it
// sleeps, as it does each time the process goes idle between requests;
// awake, it polls every 20 µs for at least a millisecond. Behind a
// gateway serving keep-alive requests that monitor was a tenth of the
// process's CPU (perf: runtime.sysmon 10.8 %, its own nanosleeps and the
// futex wake-ups); with the request path's calls raw it is 0.5 %. A call on
// a non-blocking socket never blocks, so keeping the P through it costs
// nothing; waiting for readiness still goes through the netpoller
// (RawConn.Read and Write), and deadlines and Close work as on net.Conn.
// Under the race detector the calls go through package syscall (see
// sys_race.go), so the detector sees what the socket orders.
package rawio

import "net"

// Wrap returns a net.Conn whose Read and Write make raw system calls on
// c's descriptor, or c itself when it has none (a TLS or in-memory
// connection) or the platform is not Linux. Everything else (deadlines,
// Close, addresses) is c's. The wrapper is only a net.Conn: a caller that
// needs c's own type (a *net.TCPConn to splice) keeps c.
func Wrap(c net.Conn) net.Conn { return wrap(c) }
