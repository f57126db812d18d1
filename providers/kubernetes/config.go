package kubernetes

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/proxyfleet/proxyfleet/providers"
)

// Type is this provider's type in the providers config file, and the key of
// its block.
const Type = "kubernetes"

// Config configures one kubernetes provider entry.
type Config struct {
	// Namespace the Pods are created in.
	Namespace string
	// Image is the Squid image; empty means DefaultImage.
	Image string
	// ClusterCIDRs are Pod and Service ranges outside the private ranges that
	// Squid must also refuse as destinations; clients from them are allowed.
	ClusterCIDRs []netip.Prefix
	// ClientCIDRs replaces DefaultClientCIDRs as the allowed client sources.
	ClientCIDRs []netip.Prefix
	// ClusterTargets are private ranges the Squids admit as destinations
	// all the same: the cluster's own pod and service CIDRs, for sites in
	// the cluster. Not part of the block: the controller's
	// --cluster-target-cidrs, which its injected gateways admit too, gives
	// them to every kubernetes provider (Constructor).
	ClusterTargets []netip.Prefix
}

func (c Config) clientCIDRs() []netip.Prefix {
	base := c.ClientCIDRs
	if len(base) == 0 {
		base = DefaultClientCIDRs()
	}
	return append(append([]netip.Prefix(nil), base...), c.ClusterCIDRs...)
}

// block is the kubernetes block of a providers config entry, as written:
// Squid Pods in this cluster.
type block struct {
	// Namespace the Pods are created in (required).
	Namespace string `json:"namespace"`
	// Image is the Squid container image; empty means the provider's pinned default.
	Image string `json:"image,omitempty"`
	// ClusterCIDRs are the cluster's Pod and Service ranges when they are not
	// already private (RFC 1918, CGNAT, ULA): Squid denies them as
	// destinations and accepts clients from them.
	ClusterCIDRs []string `json:"clusterCIDRs,omitempty"`
	// ClientCIDRs replaces the default set of source ranges allowed to use the
	// proxy (RFC 1918, CGNAT, ULA).
	ClientCIDRs []string `json:"clientCIDRs,omitempty"`
}

// ReadConfig reads and validates e's kubernetes block. Every problem is
// reported (providers.Problems), each naming its field
// ("kubernetes.namespace is required").
func ReadConfig(e providers.Entry) (Config, error) {
	var b block
	if err := e.Decode(Type, &b); err != nil {
		return Config{}, err
	}
	cluster, clusterProblems := providers.ParseCIDRs("kubernetes.clusterCIDRs", b.ClusterCIDRs)
	clients, clientProblems := providers.ParseCIDRs("kubernetes.clientCIDRs", b.ClientCIDRs)
	if err := providers.Problems(slices.Concat(b.validate(), clusterProblems, clientProblems)); err != nil {
		return Config{}, err
	}
	return Config{Namespace: b.Namespace, Image: b.Image, ClusterCIDRs: cluster, ClientCIDRs: clients}, nil
}

var imageRef = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*$`)

func (b block) validate() []string {
	var out []string
	if b.Namespace == "" {
		out = append(out, "kubernetes.namespace is required")
	} else if msgs := validation.IsDNS1123Label(b.Namespace); len(msgs) > 0 {
		out = append(out, fmt.Sprintf("kubernetes.namespace %q is not a DNS-1123 label: %s", b.Namespace, strings.Join(msgs, "; ")))
	}
	if b.Image != "" && !imageRef.MatchString(b.Image) {
		out = append(out, fmt.Sprintf("kubernetes.image %q is not an image reference", b.Image))
	}
	return out
}
