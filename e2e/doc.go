// Package e2e holds the end-to-end tests: the real proxyfleet binary against
// real Squid instances and, for the controller, a real kube-apiserver + etcd.
package e2e
