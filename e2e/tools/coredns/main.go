// Command coredns is the cluster DNS of the single-node cluster the
// cluster tests run (internal/testkit/node): CoreDNS from its Go module
// with only the plugins a kubeadm cluster's Corefile uses, so that none of
// the cloud DNS plugins (and their SDKs) are compiled. The plugin order is
// CoreDNS's own (plugin.cfg) for these plugins.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func init() {
	dnsserver.Directives = []string{"reload", "ready", "health", "errors", "log", "cache", "loop", "kubernetes", "forward"}
}

func main() { coremain.Run() }
