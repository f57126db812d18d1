//go:build cluster

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/node"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// clusterTimeout is how long a step on the node may take: pods start in
// seconds on an idle machine, but CI's 2 cores are shared by every suite.
const clusterTimeout = 4 * time.Minute

// TestClusterProxyPoolRunsSquidPods runs a ProxyPool of three on the
// kubernetes provider against a real node: the controller (a process
// beside the cluster, pointed at its API server) creates three Squid Pods
// of Debian's squid, the kubelet runs them, each gets its own pod IP, and
// the controller's real probes through each Squid reach a site in the
// cluster's network, which sees them come from the three pod addresses,
// so the three Proxies turn Ready.
func TestClusterProxyPoolRunsSquidPods(t *testing.T) {
	if !node.InNamespaces(t) {
		return
	}
	bin := testutil.BuildBinary(t)
	c := node.Start(t)
	c.ImportImage(node.SquidImage(t))
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c.Kubectl(t, "apply", "--server-side", "-f", filepath.Join(root, "charts/proxyfleet/crds"))
	c.CreateNamespace(t, "egress", nil)
	c.CreateNamespace(t, "fleet", nil)

	// The site stand-in listens on the node's address, which the pods
	// reach through the bridge's gateway; TEST-NET-1 is not among the
	// destinations a generated Squid refuses.
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: node.NodeIP})

	dir := t.TempDir()
	providers := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(providers, []byte("providers:\n  - name: in-cluster\n    type: kubernetes\n    kubernetes:\n      namespace: egress\n      image: "+node.SquidImageRef+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.StartProcessOnFreePorts(t, bin, 4, func(addrs []string) testutil.ProcessOptions {
		return testutil.ProcessOptions{
			Name: "controller",
			Args: []string{"controller", "--kubeconfig", c.Kubeconfig, "--proxy-namespace", "fleet", "--providers-config", providers,
				"--metrics-listen", addrs[0], "--health-probe-listen", addrs[1], "--lease-api-listen", addrs[2], "--status-listen", addrs[3],
				"--log-format", "text", "--gc-allow-namespaced"},
			WaitAddrs:    addrs,
			StartTimeout: 2 * time.Minute,
		}
	})

	pool := filepath.Join(dir, "pool.yaml")
	if err := os.WriteFile(pool, []byte(fmt.Sprintf(`apiVersion: proxyfleet.io/v1alpha1
kind: ProxyPool
metadata: {name: demo, namespace: fleet}
spec:
  replicas: 3
  template:
    spec:
      provider: in-cluster
      healthCheck: {url: "%s/health", intervalSeconds: 2, timeoutSeconds: 2}
`, site.URL())), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Kubectl(t, "apply", "-f", pool)

	s, err := testenv.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var ready []v1alpha1.Proxy
	err = poll.Wait(clusterTimeout, "three Ready Proxies of pool demo", func() error {
		var list v1alpha1.ProxyList
		if err := cl.List(ctx, &list, client.InNamespace("fleet")); err != nil {
			return err
		}
		ready = ready[:0]
		var states []string
		for _, p := range list.Items {
			states = append(states, fmt.Sprintf("%s: %s ip=%q %v", p.Name, p.Status.Phase, p.Status.IP, p.Status.Conditions))
			if p.Status.Phase == v1alpha1.PhaseReady {
				ready = append(ready, p)
			}
		}
		if len(ready) != 3 {
			return fmt.Errorf("%d Ready of %d: %s", len(ready), len(list.Items), strings.Join(states, "; "))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, c.DescribePods("egress"))
	}

	pods, err := c.Client.CoreV1().Pods("egress").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podIPs := map[string]bool{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("Squid pod %s is %s, want Running", p.Name, p.Status.Phase)
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !netip.MustParsePrefix(node.PodCIDR).Contains(ip) {
			t.Errorf("Squid pod %s has IP %q, want one of %s", p.Name, p.Status.PodIP, node.PodCIDR)
		}
		podIPs[p.Status.PodIP] = true
	}
	if len(pods.Items) != 3 || len(podIPs) != 3 {
		t.Fatalf("%d Squid pods with %d distinct IPs, want 3 and 3", len(pods.Items), len(podIPs))
	}
	for _, px := range ready {
		if !podIPs[px.Status.IP] {
			t.Errorf("Ready Proxy %s has IP %q, which no Squid pod has (%v)", px.Name, px.Status.IP, podIPs)
		}
	}
	// The probes went through the Squids: the site saw each pod's address.
	var seen []string
	for src := range site.Counts() {
		seen = append(seen, src)
	}
	sort.Strings(seen)
	for ip := range podIPs {
		if site.Count(ip) == 0 {
			t.Errorf("the site saw no probe from Squid pod %s; it saw %v", ip, seen)
		}
	}
}
