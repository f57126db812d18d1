// Package e2e holds the end-to-end tests: the real proxyfleet binary against
// real Squid instances and, for the controller, a real kube-apiserver + etcd.
//
// Its tests start the built binaries (PROXYFLEET_BIN) and the real servers of
// internal/testkit; they import product packages only for their wire types,
// never to call the code under test in-process.
package e2e
