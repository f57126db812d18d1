//go:build cluster

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/inject"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/node"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/statuspage"
)

// The addresses of the sites beside the node's own (the namespace's
// TEST-NET-1 interface): one that bans a Squid, another, and an HTTPS one
// with a private CA crawled under MITM.
const (
	strictSiteIP = "192.0.2.2"
	otherSiteIP  = "192.0.2.3"
	mitmSiteIP   = "192.0.2.4"
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

// The images make image writes with IMAGE_REPO=proxyfleet.local
// IMAGE_TAG=dev (make cluster-test builds them so).
const (
	controllerImageRepo = "proxyfleet.local/proxyfleet"
	sidecarImageRepo    = "proxyfleet.local/proxyfleet-sidecar"
	localImageTag       = "dev"
	// upgradeImageTag is the controller image helm upgrade moves to: the
	// same image under another tag, which changes the pod template.
	upgradeImageTag = "dev-upgraded"
)

// localImages imports the controller and sidecar images of make image
// (bin/proxyfleet-image.tar, bin/proxyfleet-sidecar-image.tar) into the
// node, failing the test with how to build them when they are missing.
func localImages(t *testing.T, c *node.Cluster) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"proxyfleet-image.tar", "proxyfleet-sidecar-image.tar"} {
		p := filepath.Join(root, "bin", f)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v (make image IMAGE_REPO=proxyfleet.local IMAGE_TAG=dev builds it)", err)
		}
		c.ImportImage(p)
	}
	out := c.Ctr(t, "images", "ls", "-q")
	for _, ref := range []string{controllerImageRepo + ":" + localImageTag, sidecarImageRepo + ":" + localImageTag} {
		if !strings.Contains(out, ref) {
			t.Fatalf("the node has no image %s after the import; it has:\n%s", ref, out)
		}
	}
}

// helmInstall installs charts/proxyfleet as release proxyfleet in
// proxyfleet-system with the Helm SDK, as `helm install --wait` does, with
// the local images and a kubernetes provider running Squid Pods of the
// local Squid image in namespace egress.
func helmInstall(t *testing.T, c *node.Cluster) {
	t.Helper()
	cfg, ch := helmChart(t, c)
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace = "proxyfleet", "proxyfleet-system", true
	in.Wait, in.Timeout = true, clusterTimeout
	if _, err := in.Run(ch, chartValues(localImageTag)); err != nil {
		t.Fatalf("helm install: %v\n%s", err, c.DescribePods("proxyfleet-system"))
	}
}

// helmUpgrade upgrades release proxyfleet to the controller image tagged
// controllerTag, as `helm upgrade --wait` does.
func helmUpgrade(t *testing.T, c *node.Cluster, controllerTag string) {
	t.Helper()
	cfg, ch := helmChart(t, c)
	up := action.NewUpgrade(cfg)
	up.Namespace, up.Wait, up.Timeout = "proxyfleet-system", true, clusterTimeout
	if _, err := up.Run("proxyfleet", ch, chartValues(controllerTag)); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, c.DescribePods("proxyfleet-system"))
	}
}

// helmChart loads charts/proxyfleet and a Helm action configuration for
// the cluster's namespace proxyfleet-system.
func helmChart(t *testing.T, c *node.Cluster) (*action.Configuration, *chart.Chart) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.Load(filepath.Join(root, "charts/proxyfleet"))
	if err != nil {
		t.Fatal(err)
	}
	settings := cli.New()
	settings.KubeConfig = c.Kubeconfig
	cfg := new(action.Configuration)
	if err := cfg.Init(settings.RESTClientGetter(), "proxyfleet-system", "secret", t.Logf); err != nil {
		t.Fatal(err)
	}
	return cfg, ch
}

// chartValues are the chart's values on the node: the local images (the
// controller's tagged controllerTag) and a kubernetes provider of Squid
// Pods in namespace egress.
func chartValues(controllerTag string) map[string]any {
	return map[string]any{
		"image":   map[string]any{"repository": controllerImageRepo, "tag": controllerTag, "pullPolicy": "Never"},
		"sidecar": map[string]any{"image": map[string]any{"repository": sidecarImageRepo, "tag": localImageTag}},
		// The sites of the last step run in the cluster, at private
		// addresses of its pod and service ranges.
		"clusterTargets": map[string]any{"cidrs": []any{node.PodCIDR, node.ServiceCIDR}},
		"providers": map[string]any{"providers": []any{map[string]any{
			"name": "in-cluster", "type": "kubernetes",
			"kubernetes": map[string]any{"namespace": "egress", "image": node.SquidImageRef},
		}}},
	}
}

// TestClusterChartInstallsAndRunsAPool installs charts/proxyfleet with the
// images of make image on a real node: the controller Deployment becomes
// Available, the CRDs are in, the injection webhook serves (a server-side
// dry run of a pod in a labelled namespace comes back with the sidecar),
// and a ProxyPool of three on the chart's kubernetes provider gets three
// running Squid Pods whose Proxies the in-cluster controller's probes make
// Ready. Then a crawler pod (curl, python requests) in the labelled
// namespace starts with the injected sidecar, which leases with the
// kubelet-projected token, and its requests reach the site from the Squid
// pods' addresses, more than one of them; a crawler whose service account
// has no RoleBinding is refused by the lease API (403) and reaches nothing.
func TestClusterChartInstallsAndRunsAPool(t *testing.T) {
	if !node.InNamespaces(t) {
		return
	}
	c := node.Start(t)
	c.ImportImage(node.SquidImage(t))
	localImages(t, c)
	c.CreateNamespace(t, "egress", nil)
	helmInstall(t, c)
	ctx := context.Background()

	dep, err := c.Client.AppsV1().Deployments("proxyfleet-system").Get(ctx, "proxyfleet", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	available := false
	for _, cond := range dep.Status.Conditions {
		if cond.Type == appsv1.DeploymentAvailable && cond.Status == corev1.ConditionTrue {
			available = true
		}
	}
	if !available || dep.Status.AvailableReplicas < 1 {
		t.Fatalf("the controller Deployment is not Available after helm install --wait: %+v\n%s", dep.Status, c.DescribePods("proxyfleet-system"))
	}
	crds := c.Kubectl(t, "get", "crd", "-o", "name")
	for _, crd := range []string{"proxies.proxyfleet.io", "proxypools.proxyfleet.io"} {
		if !strings.Contains(crds, crd) {
			t.Errorf("CRD %s is not installed; the cluster has:\n%s", crd, crds)
		}
	}

	// The webhook serves: the API server calls it for a pod of a labelled
	// namespace, and the dry run's answer carries the injected sidecar.
	c.CreateNamespace(t, "crawlers", map[string]string{"proxyfleet.io/inject": "true"})
	var injected *corev1.Pod
	err = poll.Wait(clusterTimeout, "the webhook to inject the sidecar", func() error {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "crawler", Namespace: "crawlers"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "crawler", Image: node.PauseImageRef, ImagePullPolicy: corev1.PullNever}}},
		}
		got, err := c.Client.CoreV1().Pods("crawlers").Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		var names []string
		for _, ct := range append(append([]corev1.Container{}, got.Spec.InitContainers...), got.Spec.Containers...) {
			names = append(names, ct.Name+"="+ct.Image)
			if strings.HasPrefix(ct.Image, sidecarImageRepo+":") {
				injected = got
			}
		}
		if injected == nil {
			return fmt.Errorf("no sidecar of %s in the pod: %v", sidecarImageRepo, names)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, c.DescribePods("proxyfleet-system"))
	}

	site := testutil.StartTarget(t, testutil.TargetOptions{Host: node.NodeIP})
	c.CreateNamespace(t, "fleet", nil)
	pool := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(pool, []byte(fmt.Sprintf(`apiVersion: proxyfleet.io/v1alpha1
kind: ProxyPool
metadata: {name: demo, namespace: fleet}
spec:
  replicas: 3
  drainSeconds: 10
  replaceUnhealthyAfter: 10s
  template:
    spec:
      provider: in-cluster
      healthCheck: {url: "%s/health", intervalSeconds: 2, timeoutSeconds: 2}
---
# The crawlers lease the fleet's pool because its owner shares it (docs/tenancy.md).
apiVersion: proxyfleet.io/v1alpha1
kind: ProxyGrant
metadata: {name: crawlers, namespace: fleet}
spec:
  to: [{namespace: crawlers}]
  pools: [demo]
`, site.URL())), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Kubectl(t, "apply", "-f", pool)
	err = poll.Wait(clusterTimeout, "three Ready Proxies of pool demo", func() error {
		out := c.Kubectl(t, "get", "proxies", "-n", "fleet", "-o", "jsonpath={range .items[*]}{.status.phase} {end}")
		if strings.Count(out, "Ready") != 3 {
			return fmt.Errorf("phases: %q", out)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, c.DescribePods("egress"), c.DescribePods("proxyfleet-system"))
	}
	pods, err := c.Client.CoreV1().Pods("egress").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || site.Count(p.Status.PodIP) == 0 {
			t.Errorf("Squid pod %s: %s at %q, %d probes seen from it", p.Name, p.Status.Phase, p.Status.PodIP, site.Count(p.Status.PodIP))
		}
	}
	if len(pods.Items) != 3 {
		t.Errorf("%d Squid pods, want 3", len(pods.Items))
	}

	// A crawler in the labelled namespace gets the sidecar, which leases
	// with the pod's kubelet-projected service-account token; its curl and
	// requests calls through HTTP(S)_PROXY reach the site from the Squid
	// pods' addresses, across more than one of them.
	c.ImportImage(node.CrawlerImage(t))
	c.Kubectl(t, "-n", "crawlers", "create", "serviceaccount", "crawler")
	c.Kubectl(t, "-n", "crawlers", "create", "rolebinding", "crawler-leases", "--clusterrole=proxyfleet-lease-user", "--serviceaccount=crawlers:crawler")
	c.Kubectl(t, "-n", "crawlers", "create", "serviceaccount", "unbound")
	squidIPs := map[string]bool{}
	for _, p := range pods.Items {
		squidIPs[p.Status.PodIP] = true
	}
	script := fmt.Sprintf(`ok=0
for i in $(seq 1 12); do
  code=$(curl -s -o /dev/null -w '%%{http_code}' %[1]s/crawl/$POD/curl/$i); echo "curl $i $code"
  [ "$code" = 200 ] && ok=$((ok+1))
done
python3 - <<'PY' || exit 1
import os, requests, sys
n = 0
for i in range(12):
    r = requests.get("%[1]s/crawl/%%s/requests/%%d" %% (os.environ["POD"], i), timeout=30)
    print("requests", i, r.status_code)
    n += r.status_code == 200
sys.exit(0 if n == 12 else 1)
PY
%[2]s
[ "$ok" = 12 ]`, site.URL(), leaseScript)
	out := runCrawler(t, c, "crawler", "crawler", script, nil)
	sources := map[string]int{}
	for _, r := range site.Requests() {
		if strings.HasPrefix(r.URI, "/crawl/crawler/") {
			sources[r.Source]++
			if !squidIPs[r.Source] {
				t.Errorf("the site saw %s from %s, which is no Squid pod (%v)", r.URI, r.Source, squidIPs)
			}
		}
	}
	if n := sources[""]; n > 0 || len(sources) < 2 {
		t.Errorf("the crawler's 24 requests came from %v, want them spread over the Squid pods %v\n%s", sources, squidIPs, out)
	}

	// The lease API, reached by its Service name through the cluster DNS,
	// takes the kubelet-projected token of the bound service account.
	if !strings.Contains(out, "lease 201") {
		t.Errorf("the lease API did not lease to the crawler's projected token:\n%s", out)
	}

	// A crawler whose service account has no binding is refused: the lease
	// API answers its token 403, and its requests never reach the site.
	out = runCrawler(t, c, "unbound", "unbound", fmt.Sprintf(`curl -s -w '\ncode %%{http_code}\n' %s/crawl/$POD/curl
%s
true`, site.URL(), leaseScript), nil)
	for _, r := range site.Requests() {
		if strings.HasPrefix(r.URI, "/crawl/unbound/") {
			t.Errorf("a crawler without the lease binding reached the site: %s from %s", r.URI, r.Source)
		}
	}
	t.Logf("the crawler without the lease binding:\n%s", out)
	if !strings.Contains(out, "lease 403") || !strings.Contains(out, "code 403") {
		t.Errorf("a crawler without the lease binding was not refused (want lease 403, and its sidecar's 403 pool_forbidden):\n%s", out)
	}

	// A site that bans two of the three Squids' addresses: the sidecar
	// rests a banned member for that site only, through the real data path.
	// A ban is retried on another member (a GET), so the crawler sees 200
	// every time; the site asks each banned Squid once at most, and the
	// Squids it banned go on carrying another site; the cooldowns are the
	// lease API's, for that site only, shared with every gateway. (Two are banned because the
	// per-request rotation prefers members without leases, and a finished
	// pod's lease may still hold one.) Two sites need two hosts (the target
	// key drops the port); the pool's probes stay on the first site, which
	// bans nobody.
	testutil.AddNetNSAddr(t, strictSiteIP)
	testutil.AddNetNSAddr(t, otherSiteIP)
	strict := testutil.StartTarget(t, testutil.TargetOptions{Host: strictSiteIP})
	other := testutil.StartTarget(t, testutil.TargetOptions{Host: otherSiteIP})
	bannedIPs := []string{pods.Items[0].Status.PodIP, pods.Items[1].Status.PodIP}
	for _, ip := range bannedIPs {
		strict.SetRule(ip, http.StatusForbidden, nil)
	}
	out = runCrawler(t, c, "banned", "crawler", fmt.Sprintf(`ok=0
for i in $(seq 1 12); do code=$(curl -s -o /dev/null -w '%%{http_code}' %[1]s/ban/$i); echo "strict $i $code"; [ "$code" = 200 ] && ok=$((ok+1)); done
for i in $(seq 1 12); do code=$(curl -s -o /dev/null -w '%%{http_code}' %[2]s/other/$i); echo "other $i $code"; [ "$code" = 200 ] && ok=$((ok+1)); done
%[3]s
[ "$ok" = 24 ]`, strict.URL(), other.URL(), proxiesScript), nil)
	asked, carried := map[string]int{}, map[string]int{}
	for _, r := range strict.Requests() {
		if strings.HasPrefix(r.URI, "/ban/") {
			asked[r.Source]++
		}
	}
	for _, r := range other.Requests() {
		if strings.HasPrefix(r.URI, "/other/") {
			carried[r.Source]++
		}
	}
	resting := map[string]bool{}
	for _, p := range leaseAPIProxies(t, out) {
		for _, cd := range p.Cooldowns {
			rested := false
			for _, ip := range bannedIPs {
				if strings.Contains(p.URL, ip+":") && cd.Target == strictSiteIP {
					resting[ip], rested = true, true
				}
			}
			if !rested {
				t.Errorf("the lease API shows %s resting for %q; only a banned Squid should rest, for %s", p.URL, cd.Target, strictSiteIP)
			}
		}
	}
	// A banned Squid without a lease of the finished crawler's carries
	// some of the other site's requests (the rotation prefers those).
	banSeen, carriedOn := false, false
	for _, ip := range bannedIPs {
		if asked[ip] > 1 {
			t.Errorf("the strict site asked Squid %s, which it bans, %d times; want 1 at most (the ban rests it there)", ip, asked[ip])
		}
		if asked[ip] == 1 {
			banSeen = true
			if !resting[ip] {
				t.Errorf("Squid %s was banned by %s, and the lease API shows no cooldown of it there", ip, strictSiteIP)
			}
			carriedOn = carriedOn || carried[ip] > 0
		}
	}
	if !banSeen {
		t.Errorf("no request to the strict site went through a Squid it bans (%v); the test saw no ban", bannedIPs)
	} else if !carriedOn {
		t.Errorf("no Squid the strict site banned carried a request to %s: %v", otherSiteIP, carried)
	}
	t.Logf("the strict site asked %v, the other site saw %v; resting for %s: %v", asked, carried, strictSiteIP, resting)
	if t.Failed() {
		t.Fatalf("the banning site's crawler:\n%s", out)
	}

	// A MITM crawler pod (proxyfleet.io/mitm): its curl trusts the injected
	// CA through CURL_CA_BUNDLE, its sidecar trusts the site's private CA
	// through proxyfleet.io/upstream-ca, and inside HTTPS the sidecar reads
	// the site's answers: they carry X-Proxyfleet-Attempts, and a 429 to
	// one Squid rests that member for the site (retried on another, so the
	// crawler sees 200).
	testutil.AddNetNSAddr(t, mitmSiteIP)
	// On 443: a generated Squid CONNECTs to no other port.
	secure := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: mitmSiteIP, Port: 443})
	limitedIPs := []string{pods.Items[1].Status.PodIP, pods.Items[2].Status.PodIP}
	for _, ip := range limitedIPs {
		secure.SetRule(ip, http.StatusTooManyRequests, map[string]string{"Retry-After": "600"})
	}
	caDir := t.TempDir()
	caCert, caKey, siteCA := filepath.Join(caDir, "ca.pem"), filepath.Join(caDir, "ca-key.pem"), filepath.Join(caDir, "site.pem")
	if out, err := exec.Command(os.Getenv("PROXYFLEET_BIN"), "mitm-ca", "init", "--cert", caCert, "--key", caKey).CombinedOutput(); err != nil {
		t.Fatalf("proxyfleet mitm-ca init: %v\n%s", err, out)
	}
	if err := os.WriteFile(siteCA, secure.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Kubectl(t, "-n", "crawlers", "create", "secret", "tls", "crawl-mitm-ca", "--cert", caCert, "--key", caKey)
	c.Kubectl(t, "-n", "crawlers", "create", "configmap", "site-roots", "--from-file=ca.crt="+siteCA)
	out = runCrawler(t, c, "mitm", "crawler", fmt.Sprintf(`ok=0; attempts=0
for i in $(seq 1 12); do
  code=$(curl -s -o /dev/null -D /tmp/head -w '%%{http_code}' %s/mitm/$i)
  echo "mitm $i $code $(grep -i '^x-proxyfleet-\|^retry-after' /tmp/head | tr -d '\r' | tr '\n' ' ')"
  [ "$code" = 200 ] && ok=$((ok+1))
  grep -qi '^x-proxyfleet-attempts: [0-9]' /tmp/head && attempts=$((attempts+1))
done
echo "attempts headers $attempts"
[ "$ok" = 12 ] && [ "$attempts" = 12 ]`, secure.URL()), map[string]string{inject.AnnotationMITM: "crawl-mitm-ca", inject.AnnotationUpstreamCA: "site-roots"})
	limited := map[string]int{}
	for _, r := range secure.Requests() {
		if strings.HasPrefix(r.URI, "/mitm/") {
			limited[r.Source]++
		}
	}
	limitSeen := false
	for _, ip := range limitedIPs {
		if limited[ip] > 1 {
			t.Errorf("the site asked Squid %s, which it answers 429, %d times through MITM'd tunnels; want 1 at most (the 429 rests it for the site)\n%s", ip, limited[ip], out)
		}
		limitSeen = limitSeen || limited[ip] == 1
	}
	if !limitSeen {
		t.Errorf("no MITM'd request went through a Squid the site answers 429 (%v): the test saw no 429 (%v)\n%s", limitedIPs, limited, out)
	}

	// kubectl scale: to five, whose two new Squid pods then carry the
	// crawler's traffic, and to two, draining three, while a crawler loops
	// idempotent GETs the whole time and sees none fail.
	startCrawler(t, c, "looper", "crawler", fmt.Sprintf(`n=0; fail=0
while [ ! -e /tmp/stop ]; do
  n=$((n+1)); code=$(curl -s -o /dev/null -w '%%{http_code}' %s/loop/$n)
  [ "$code" = 200 ] || { fail=$((fail+1)); echo "GET $n: $code"; }
  sleep 0.2
done
echo "GETs $n failed $fail"; [ "$fail" = 0 ]`, site.URL()), nil)
	c.WaitPodRunning(t, "crawlers", "looper", clusterTimeout)
	c.Kubectl(t, "-n", "fleet", "scale", "proxypool/demo", "--replicas", "5")
	waitSquids := func(n int) map[string]bool {
		t.Helper()
		ips := map[string]bool{}
		err := poll.Wait(clusterTimeout, fmt.Sprintf("%d Ready Proxies and %d running Squid pods", n, n), func() error {
			out := c.Kubectl(t, "get", "proxies", "-n", "fleet", "-o", "jsonpath={range .items[*]}{.status.phase} {end}")
			if strings.Count(out, "Ready") != n || len(strings.Fields(out)) != n {
				return fmt.Errorf("Proxy phases: %q", out)
			}
			pods, err := c.Client.CoreV1().Pods("egress").List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			clear(ips)
			for _, p := range pods.Items {
				if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
					return fmt.Errorf("Squid pod %s: %s", p.Name, p.Status.Phase)
				}
				ips[p.Status.PodIP] = true
			}
			if len(ips) != n {
				return fmt.Errorf("%d Squid pods", len(ips))
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, c.DescribePods("egress"))
		}
		return ips
	}
	five := waitSquids(5)
	var fresh []string
	for ip := range five {
		if !squidIPs[ip] {
			fresh = append(fresh, ip)
		}
	}
	err = poll.Wait(clusterTimeout, "the new Squid pods to carry the looping crawler's GETs", func() error {
		for _, ip := range fresh {
			carried := false
			for _, r := range site.Requests() {
				if r.Source == ip && strings.HasPrefix(r.URI, "/loop/") {
					carried = true
				}
			}
			if !carried {
				return fmt.Errorf("no GET through new Squid pod %s yet", ip)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c.Kubectl(t, "-n", "fleet", "scale", "proxypool/demo", "--replicas", "2")
	two := waitSquids(2)

	// A Squid pod deleted under that load: its Proxy is replaced by one
	// with a new pod, and still no GET of the looping crawler fails.
	pods, err = c.Client.CoreV1().Pods("egress").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	victim := pods.Items[0]
	c.Kubectl(t, "-n", "egress", "delete", "pod", victim.Name, "--wait=false")
	// Its Proxy leaves Ready (the pod is gone: the provider creates it
	// again, at a new address, or the probes through it fail) and the lease
	// API stops offering it, before it is Ready again at a new address.
	proxies := func() [][]string {
		out := c.Kubectl(t, "get", "proxies", "-n", "fleet", "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.ip}={.status.phase} {end}")
		var rows [][]string
		for _, f := range strings.Fields(out) {
			rows = append(rows, strings.SplitN(f, "=", 3))
		}
		return rows
	}
	var victimProxy string
	for _, row := range proxies() {
		if len(row) == 3 && row[1] == victim.Status.PodIP {
			victimProxy = row[0]
		}
	}
	if victimProxy == "" {
		t.Fatalf("no Proxy has Squid pod %s's address %s: %v", victim.Name, victim.Status.PodIP, proxies())
	}
	var phases []string
	err = poll.Wait(clusterTimeout, "Proxy "+victimProxy+" to leave Ready at "+victim.Status.PodIP, func() error {
		rows := proxies()
		if !slices.ContainsFunc(rows, func(row []string) bool { return row[0] == victimProxy }) {
			phases = append(phases, "gone")
			return nil
		}
		for _, row := range rows {
			if len(row) != 3 || row[0] != victimProxy {
				continue
			}
			if seen := row[2] + "@" + row[1]; len(phases) == 0 || phases[len(phases)-1] != seen {
				phases = append(phases, seen)
			}
			if row[2] != string(v1alpha1.PhaseReady) || row[1] != victim.Status.PodIP {
				return nil
			}
		}
		return fmt.Errorf("phases seen: %v", phases)
	}, poll.Every(200*time.Millisecond))
	if err != nil {
		t.Fatalf("%v\n%s", err, c.DescribePods("egress"))
	}
	offered := c.Kubectl(t, "-n", "crawlers", "exec", "looper", "-c", "crawler", "--", "sh", "-c", proxiesScript)
	for _, p := range leaseAPIProxies(t, offered) {
		if strings.Contains(p.URL, victim.Status.PodIP+":") && p.Healthy {
			t.Errorf("the lease API still offers %s (%s), whose Squid pod is deleted and whose Proxy went %v", p.Name, p.URL, phases)
		}
	}
	t.Logf("the deleted Squid pod's Proxy %s went %v", victimProxy, phases)
	err = poll.Wait(clusterTimeout, "the deleted Squid pod's replacement", func() error {
		now := waitSquids(2)
		if now[victim.Status.PodIP] {
			return fmt.Errorf("the deleted pod's address %s is still a Squid's (%v)", victim.Status.PodIP, now)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v (before: %v)\n%s", err, two, c.DescribePods("egress"))
	}
	// A Squid container killed through containerd under that load: the
	// kubelet restarts it in its pod, and still no GET fails.
	pods, err = c.Client.CoreV1().Pods("egress").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	killed := pods.Items[0]
	if len(killed.Status.ContainerStatuses) != 1 || !strings.HasPrefix(killed.Status.ContainerStatuses[0].ContainerID, "containerd://") {
		t.Fatalf("Squid pod %s has container statuses %+v", killed.Name, killed.Status.ContainerStatuses)
	}
	c.Ctr(t, "tasks", "kill", "--signal", "SIGKILL", strings.TrimPrefix(killed.Status.ContainerStatuses[0].ContainerID, "containerd://"))
	err = poll.Wait(clusterTimeout, "the kubelet to restart the killed Squid container", func() error {
		p, err := c.Client.CoreV1().Pods("egress").Get(ctx, killed.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if st := p.Status.ContainerStatuses; len(st) != 1 || st[0].RestartCount < 1 || !st[0].Ready {
			return fmt.Errorf("container statuses %+v", st)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, c.DescribePods("egress"))
	}
	squidsBefore := waitSquids(2)

	// helm upgrade to a changed controller image under that load: the
	// chart's Recreate strategy stops the one controller before the next
	// starts (its lease store is in memory), the sidecars ride the gap out
	// on the members they last knew, the new controller takes the running
	// Squid pods over without replacing them, and still no GET fails.
	c.Ctr(t, "images", "tag", controllerImageRepo+":"+localImageTag, controllerImageRepo+":"+upgradeImageTag)
	helmUpgrade(t, c, upgradeImageTag)
	err = poll.Wait(clusterTimeout, "the upgraded controller to run alone", func() error {
		pods, err := c.Client.CoreV1().Pods("proxyfleet-system").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var images []string
		for _, p := range pods.Items {
			for _, ct := range p.Spec.Containers {
				images = append(images, ct.Image+" "+string(p.Status.Phase))
			}
		}
		if len(images) != 1 || images[0] != controllerImageRepo+":"+upgradeImageTag+" Running" {
			return fmt.Errorf("controller pods: %v", images)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, c.DescribePods("proxyfleet-system"))
	}
	if after := waitSquids(2); !maps.Equal(after, squidsBefore) {
		t.Errorf("the upgraded controller replaced the Squid pods: %v before, %v after", squidsBefore, after)
	}

	// The status pages, reached with kubectl port-forward as
	// docs/operations.md says, render in headless Chromium with the
	// running members: the controller's with its Proxies, the looping
	// crawler's sidecar's with the Squids it leases.
	// (Subtests, so that each page's screenshot has a name of its own.)
	for _, page := range []struct {
		name, namespace, target string
		port                    int
	}{
		{"controller status page", "proxyfleet-system", "deploy/proxyfleet", 8082},
		{"sidecar status page", "crawlers", "pod/looper", 15091}, // inject.StatusAddr
	} {
		t.Run(page.name, func(t *testing.T) {
			dom := statusPage(t, "http://"+c.PortForward(t, page.namespace, page.target, page.port)+statuspage.PagePath)
			for ip := range squidsBefore {
				if !strings.Contains(dom, ip) {
					t.Errorf("the %s does not show Squid %s", page.name, ip)
				}
			}
		})
	}

	c.Kubectl(t, "-n", "crawlers", "exec", "looper", "-c", "crawler", "--", "touch", "/tmp/stop")
	t.Logf("the looping crawler: %s", waitCrawler(t, c, "looper"))

	// A site in the cluster, at private addresses (clusterTargets.cidrs
	// admits the node's pod and service ranges): a crawler reaches it
	// through its sidecar and the Squids, by the Service's ClusterIP and
	// by the pod's IP; a private address outside those ranges is still
	// refused by the sidecar.
	siteIP, sitePodIP := startClusterSite(t, c, "sites")
	out = runCrawler(t, c, "incluster", "crawler", fmt.Sprintf(`ok=0
for i in 1 2 3 4 5 6; do code=$(curl -s -o /dev/null -w '%%{http_code}' http://%[1]s/service/$i); echo "service $i $code"; [ "$code" = 200 ] && ok=$((ok+1)); done
for i in 1 2 3 4 5 6; do code=$(curl -s -o /dev/null -w '%%{http_code}' http://%[2]s:%[3]d/pod/$i); echo "pod $i $code"; [ "$code" = 200 ] && ok=$((ok+1)); done
echo "outside $(curl -s -o /dev/null -w '%%{http_code} %%header{x-proxyfleet-reason}' http://10.0.0.1/outside)"
[ "$ok" = 12 ]`, siteIP, sitePodIP, clusterSitePort), nil)
	if !strings.Contains(out, "outside 403 private_target") {
		t.Errorf("a private target outside the cluster's ranges was not refused by the sidecar (want 403 private_target):\n%s", out)
	}
	carried = map[string]int{}
	for _, h := range clusterSiteHits(t, c, "sites") {
		if !strings.HasPrefix(h.path, "/service/") && !strings.HasPrefix(h.path, "/pod/") {
			continue
		}
		carried[h.source]++
		if !squidsBefore[h.source] {
			t.Errorf("the site in the cluster saw %s from %s, which is no Squid pod (%v)", h.path, h.source, squidsBefore)
		}
	}
	if n := carried[""]; n > 0 || len(carried) == 0 {
		t.Errorf("the site in the cluster saw the crawler's requests from %v, want them from the Squid pods %v\n%s", carried, squidsBefore, out)
	}
	t.Logf("the site in the cluster (%s, pod %s) saw the crawler's 12 GETs from %v", siteIP, sitePodIP, carried)
}

// leaseScript asks the chart's lease API, by its Service name, for a lease
// with the pod's projected token and prints "lease <status>".
const leaseScript = `curl -s -o /dev/null -w 'lease %{http_code}\n' -X POST -d '{}' -H 'Content-Type: application/json' -H "Authorization: Bearer $(cat /var/run/lease/token)" http://proxyfleet.proxyfleet-system.svc:8090/v1/leases`

// runCrawler runs script (sh) in a pod of the crawler image in namespace
// crawlers under service account sa, rotating per request, with $POD set to name, waits until it
// ends and returns its log; a script that fails fails the test with the
// log and the pod's state.
func runCrawler(t *testing.T, c *node.Cluster, name, sa, script string, annotations map[string]string) string {
	t.Helper()
	startCrawler(t, c, name, sa, script, annotations)
	return waitCrawler(t, c, name)
}

// startCrawler creates the pod runCrawler runs, without waiting.
func startCrawler(t *testing.T, c *node.Cluster, name, sa, script string, annotations map[string]string) {
	t.Helper()
	ctx := context.Background()
	// A new Squid for every request (the sidecar is sticky by default).
	annotations = maps.Clone(annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[inject.AnnotationRotation] = "request"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "crawlers", Annotations: annotations},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			RestartPolicy:      corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "crawler", Image: node.CrawlerImageRef, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"/bin/sh", "-c", script},
				Env:          []corev1.EnvVar{{Name: "POD", Value: name}},
				VolumeMounts: []corev1.VolumeMount{{Name: "lease-token", MountPath: "/var/run/lease", ReadOnly: true}},
			}},
			// The kubelet projects a token for the lease API's audience,
			// as it does for the sidecar, so the script can ask the lease
			// API itself what it answers this service account.
			Volumes: []corev1.Volume{{Name: "lease-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "proxyfleet", Path: "token"}}},
			}}}},
		},
	}
	if _, err := c.Client.CoreV1().Pods("crawlers").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitCrawler waits until crawler pod name ends and returns its log,
// failing the test when its script failed.
func waitCrawler(t *testing.T, c *node.Cluster, name string) string {
	t.Helper()
	ctx := context.Background()
	var phase corev1.PodPhase
	err := poll.Wait(clusterTimeout, "crawler pod "+name+" to finish", func() error {
		p, err := c.Client.CoreV1().Pods("crawlers").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		phase = p.Status.Phase
		if phase == corev1.PodSucceeded || phase == corev1.PodFailed {
			return nil
		}
		return fmt.Errorf("phase %s", phase)
	})
	logs, _ := c.Client.CoreV1().Pods("crawlers").GetLogs(name, &corev1.PodLogOptions{Container: "crawler"}).DoRaw(ctx)
	if err != nil || phase != corev1.PodSucceeded {
		sidecar, _ := c.Client.CoreV1().Pods("crawlers").GetLogs(name, &corev1.PodLogOptions{Container: "proxyfleet-gateway"}).DoRaw(ctx)
		t.Fatalf("crawler pod %s: %v (phase %s)\ncrawler log:\n%s\nsidecar log:\n%s\n%s", name, err, phase, logs, sidecar, c.DescribePods("crawlers"))
	}
	return string(logs)
}

// proxiesScript prints the lease API's GET /v1/proxies, asked by its
// Service name with the pod's projected token, on a line of its own
// starting "proxies ", for leaseAPIProxies.
const proxiesScript = `echo "proxies $(curl -s -H "Authorization: Bearer $(cat /var/run/lease/token)" http://proxyfleet.proxyfleet-system.svc:8090/v1/proxies | tr -d '\n')"`

// leaseAPIProxies reads the members proxiesScript printed in out (the
// last such line).
func leaseAPIProxies(t *testing.T, out string) []leaseapi.ProxyInfo {
	t.Helper()
	var last string
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "proxies "); ok {
			last = rest
		}
	}
	var list struct {
		Proxies []leaseapi.ProxyInfo `json:"proxies"`
	}
	if err := json.Unmarshal([]byte(last), &list); err != nil || len(list.Proxies) == 0 {
		t.Fatalf("the lease API's /v1/proxies: %v in %q\n%s", err, last, out)
	}
	return list.Proxies
}
