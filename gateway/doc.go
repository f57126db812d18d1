// Package gateway is proxyfleet's forward proxy: it authenticates crawlers,
// reads their username parameters, leases an upstream member per (session,
// target) from a pool, chains CONNECT and plain HTTP through it, reads
// answers as rotation feedback and retries on another member where safe.
//
// It is a small net/http handler with explicit hooks (a pool, a resolver, a
// recorder) and nothing global; it never reads HTTP(S)_PROXY from its own
// environment.
package gateway
