//go:build cluster

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/proxyfleet/proxyfleet/controller/inject"
	"github.com/proxyfleet/proxyfleet/internal/testkit/node"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// The environment of TestDemoCluster's `make cluster` mode (hack/cluster.sh).
const (
	// clusterDirEnv names the directory of the cluster's files
	// (bin/cluster): pid, netns.pid, kubeconfig, README.txt, ready. Set,
	// the cluster stays up until the test's process is sent SIGTERM.
	clusterDirEnv = "PROXYFLEET_CLUSTER_DIR"
	// clusterAPIEnv carries, from the parent side to the cluster's side,
	// the machine's address that ForwardIntoCluster carries to the API
	// server.
	clusterAPIEnv = "PROXYFLEET_CLUSTER_API"
)

// The demo's fixed names (docs/cluster.md, "A cluster on one machine").
const (
	demoPool        = "demo"
	demoEgressNS    = "egress"
	demoCrawlersNS  = "crawlers"
	demoSitesNS     = "sites"
	demoCrawlerName = "crawler"
)

// TestDemoCluster brings up what `make cluster` leaves running: the node,
// the chart installed as release proxyfleet in proxyfleet-system with the
// local images and the cluster's own ranges admitted (clusterTargets), a
// ProxyPool demo of three Squid Pods on the kubernetes provider in
// namespace egress, a site in namespace sites and a crawler Deployment in
// the labelled namespace crawlers looping GETs to it through its injected
// sidecar; and checks that the site sees those GETs from the Squid pods'
// addresses, more than one of them. As a test it then ends, and the
// cluster with it. With $PROXYFLEET_CLUSTER_DIR set (hack/cluster.sh, run
// by make cluster) it writes the cluster's files there and stays up until
// SIGTERM (make cluster-down). TestClusterUpAndDownLeaveNothingBehind runs
// it that way.
func TestDemoCluster(t *testing.T) {
	dir := os.Getenv(clusterDirEnv)
	if dir != "" && !testutil.InNamespacesChild(t) {
		demoParent(t, dir)
	}
	if !node.InNamespaces(t) {
		return
	}
	var stop chan os.Signal
	if dir != "" {
		// Before anything starts: a SIGTERM meanwhile ends the cluster
		// once it is up, through the test's own cleanup.
		stop = make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	}
	c := node.Start(t)
	site, sitePod, squids := startDemo(t, c)
	if dir == "" {
		return
	}
	writeClusterFiles(t, c, dir, site, sitePod, squids)
	t.Logf("the cluster is up; %s", "make cluster-down ends it")
	sig := <-stop
	t.Logf("%v: the cluster goes down", sig)
}

// demoParent prepares TestDemoCluster's parent side for make cluster: its
// pid file, the machine's address kubectl reaches the API server at (a
// free loopback port, carried into the cluster's namespace), SIGTERM passed
// on to the cluster's process, and the cluster process's PID for
// bin/cluster/exec.
func demoParent(t *testing.T, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	t.Setenv(clusterAPIEnv, ln.Addr().String())
	go node.ForwardIntoCluster(ln, net.JoinHostPort(node.NodeIP, strconv.Itoa(node.APIServerPort)))
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		// The parent outlives the cluster's process, whose end it waits
		// for, then puts back the kernel settings and cgroups.
		for range sigs {
			if pid := node.ChildPID(); pid != 0 {
				_ = syscall.Kill(pid, syscall.SIGTERM)
			}
		}
	}()
	go func() {
		// The child starts once the machine's other node, if any, is
		// done (InNamespaces takes turns): no deadline here.
		for {
			if pid := node.ChildPID(); pid != 0 {
				_ = os.WriteFile(filepath.Join(dir, "netns.pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
}

// startDemo installs the product and the demo on c and returns once the
// site has seen the crawler's GETs from more than one Squid pod: the
// site's ClusterIP and pod IP and the Squid pods' addresses.
func startDemo(t *testing.T, c *node.Cluster) (siteIP, sitePodIP string, squids []string) {
	t.Helper()
	ctx := context.Background()
	c.ImportImage(node.SquidImage(t))
	c.ImportImage(node.CrawlerImage(t))
	localImages(t, c)
	c.CreateNamespace(t, demoEgressNS, nil)
	c.CreateNamespace(t, demoCrawlersNS, map[string]string{inject.LabelInject: "true"})
	siteIP, sitePodIP = startClusterSite(t, c, demoSitesNS)
	helmInstall(t, c)
	c.Kubectl(t, "-n", demoCrawlersNS, "create", "serviceaccount", demoCrawlerName)
	c.Kubectl(t, "-n", demoCrawlersNS, "create", "rolebinding", "crawler-leases", "--clusterrole=proxyfleet-lease-user", "--serviceaccount="+demoCrawlersNS+":"+demoCrawlerName)

	pool := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(pool, []byte(fmt.Sprintf(`apiVersion: proxyfleet.io/v1alpha1
kind: ProxyPool
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  replicas: 3
  template:
    spec:
      provider: in-cluster
      healthCheck: {url: "http://%[3]s/", intervalSeconds: 10, timeoutSeconds: 5}
---
# The crawlers lease the pool because its owner shares it (docs/tenancy.md).
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyGrant
metadata: {name: %[4]s, namespace: %[2]s}
spec:
  to: [{namespace: %[4]s}]
  pools: [%[1]s]
`, demoPool, demoEgressNS, siteIP, demoCrawlersNS)), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Kubectl(t, "apply", "-f", pool)
	err := poll.Wait(clusterTimeout, "three Ready Proxies of pool demo", func() error {
		out := c.Kubectl(t, "get", "proxies", "-n", demoEgressNS, "-o", "jsonpath={range .items[*]}{.status.phase} {end}")
		if strings.Count(out, "Ready") != 3 {
			return fmt.Errorf("phases: %q", out)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, c.DescribePods(demoEgressNS), c.DescribePods("proxyfleet-system"))
	}
	pods, err := c.Client.CoreV1().Pods(demoEgressNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=proxyfleet"})
	if err != nil {
		t.Fatal(err)
	}
	isSquid := map[string]bool{}
	for _, p := range pods.Items {
		isSquid[p.Status.PodIP] = true
		squids = append(squids, p.Status.PodIP)
	}
	sort.Strings(squids)

	// The crawler: a GET every two seconds to the site's ClusterIP, a new
	// Squid for each (rotation per request), its answer on its log.
	script := `i=0; while true; do i=$((i+1)); echo "$(date +%T) GET http://$SITE/crawl/$i $(curl -s -o /dev/null -w '%{http_code}' http://$SITE/crawl/$i)"; sleep 2; done`
	labels := map[string]string{"app": demoCrawlerName}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: demoCrawlerName, Namespace: demoCrawlersNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{inject.AnnotationRotation: "request"}},
				Spec: corev1.PodSpec{
					ServiceAccountName:            demoCrawlerName,
					TerminationGracePeriodSeconds: ptr.To(int64(2)),
					Containers: []corev1.Container{{
						Name: "crawler", Image: node.CrawlerImageRef, ImagePullPolicy: corev1.PullNever,
						Command: []string{"/bin/sh", "-c", script},
						Env:     []corev1.EnvVar{{Name: "SITE", Value: siteIP}},
					}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().Deployments(demoCrawlersNS).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	from := map[string]int{}
	err = poll.Wait(clusterTimeout, "the site to see the crawler's GETs from more than one Squid", func() error {
		clear(from)
		n := 0
		for _, h := range clusterSiteHits(t, c, demoSitesNS) {
			if strings.HasPrefix(h.path, "/crawl/") {
				from[h.source]++
				n++
			}
		}
		for src := range from {
			if !isSquid[src] {
				return fmt.Errorf("the site saw a crawler's GET from %s, which is no Squid pod (%v)", src, squids)
			}
		}
		if len(from) < 2 || n < 6 {
			return fmt.Errorf("%d GETs from %v", n, from)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, c.DescribePods(demoCrawlersNS), c.DescribePods(demoSitesNS))
	}
	t.Logf("the demo crawler's GETs reach the site (%s, pod %s) from the Squid pods %v", siteIP, sitePodIP, from)
	return siteIP, sitePodIP, squids
}

// writeClusterFiles writes what make cluster leaves in dir for people and
// scripts: a kubeconfig whose server is the machine's forwarded address,
// README.txt (how to reach the cluster, printed by make cluster), and
// ready last.
func writeClusterFiles(t *testing.T, c *node.Cluster, dir, siteIP, sitePodIP string, squids []string) {
	t.Helper()
	api := os.Getenv(clusterAPIEnv)
	if api == "" {
		t.Fatalf("no forwarded address of the API server ($%s)", clusterAPIEnv)
	}
	// The certificates are inlined: their files are on the node's tmpfs,
	// which only the cluster's mount namespace sees.
	kc, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := clientcmdapi.FlattenConfig(kc); err != nil {
		t.Fatal(err)
	}
	for _, cl := range kc.Clusters {
		cl.Server = "https://" + api
	}
	if err := clientcmd.WriteToFile(*kc, filepath.Join(dir, "kubeconfig")); err != nil {
		t.Fatal(err)
	}
	readme := fmt.Sprintf(`proxyfleet runs on a single-node cluster on this machine (make cluster; docs/cluster.md).

  API server          https://%[1]s (kubeconfig bin/cluster/kubeconfig, cluster-admin)
  product             helm release proxyfleet in namespace proxyfleet-system (images proxyfleet.local/*:dev)
  ProxyPool           %[2]s in namespace %[3]s: Squid pods at %[4]s
  site                Service site.%[5]s at %[6]s:80, pod %[7]s:%[8]d (Python's http.server, answers every GET)
  crawler             Deployment %[9]s in namespace %[10]s (labelled proxyfleet.io/inject=true): a GET every 2 s
                      to http://%[6]s/crawl/N through its sidecar; the site logs the Squids' addresses
  pod, service range  %[11]s, %[12]s (admitted as targets: the chart's clusterTargets.cidrs)

Try:
  bin/cluster/kubectl get pods -A
  bin/cluster/kubectl -n %[3]s get proxypool,proxies
  bin/cluster/kubectl -n %[10]s logs deploy/%[9]s -c crawler -f
  bin/cluster/kubectl -n %[5]s logs site -f
  bin/cluster/kubectl -n %[3]s scale proxypool %[2]s --replicas 5
  bin/cluster/kubectl -n proxyfleet-system port-forward deploy/proxyfleet 8082   # then http://127.0.0.1:8082%[13]s
  bin/cluster/exec curl -s http://%[7]s:%[8]d/   # a command in the cluster's network namespace
  KUBECONFIG=$PWD/bin/cluster/kubeconfig kubectl get nodes                    # any kubectl works too

make cluster-down removes it.
`, api, demoPool, demoEgressNS, strings.Join(squids, ", "), demoSitesNS, siteIP, sitePodIP, clusterSitePort,
		demoCrawlerName, demoCrawlersNS, node.PodCIDR, node.ServiceCIDR, statuspage.PagePath)
	if err := os.WriteFile(filepath.Join(dir, "README.txt"), []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}
