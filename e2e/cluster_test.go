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

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	appsv1 "k8s.io/api/apps/v1"
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

// The images make image writes with IMAGE_REPO=proxyfleet.local
// IMAGE_TAG=dev (make cluster-test builds them so).
const (
	controllerImageRepo = "proxyfleet.local/proxyfleet"
	sidecarImageRepo    = "proxyfleet.local/proxyfleet-sidecar"
	localImageTag       = "dev"
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
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace = "proxyfleet", "proxyfleet-system", true
	in.Wait, in.Timeout = true, clusterTimeout
	vals := map[string]any{
		"image":   map[string]any{"repository": controllerImageRepo, "tag": localImageTag, "pullPolicy": "Never"},
		"sidecar": map[string]any{"image": map[string]any{"repository": sidecarImageRepo, "tag": localImageTag}},
		"providers": map[string]any{"providers": []any{map[string]any{
			"name": "in-cluster", "type": "kubernetes",
			"kubernetes": map[string]any{"namespace": "egress", "image": node.SquidImageRef},
		}}},
	}
	if _, err := in.Run(ch, vals); err != nil {
		t.Fatalf("helm install: %v\n%s", err, c.DescribePods("proxyfleet-system"))
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
	out := runCrawler(t, c, "crawler", "crawler", script)
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
true`, site.URL(), leaseScript))
	for _, r := range site.Requests() {
		if strings.HasPrefix(r.URI, "/crawl/unbound/") {
			t.Errorf("a crawler without the lease binding reached the site: %s from %s", r.URI, r.Source)
		}
	}
	t.Logf("the crawler without the lease binding:\n%s", out)
	if !strings.Contains(out, "lease 403") || !strings.Contains(out, "code 403") {
		t.Errorf("a crawler without the lease binding was not refused (want lease 403, and its sidecar's 403 pool_forbidden):\n%s", out)
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
echo "GETs $n failed $fail"; [ "$fail" = 0 ]`, site.URL()))
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
	waitSquids(2)
	c.Kubectl(t, "-n", "crawlers", "exec", "looper", "-c", "crawler", "--", "touch", "/tmp/stop")
	t.Logf("the looping crawler: %s", waitCrawler(t, c, "looper"))
}

// leaseScript asks the chart's lease API, by its Service name, for a lease
// with the pod's projected token and prints "lease <status>".
const leaseScript = `curl -s -o /dev/null -w 'lease %{http_code}\n' -X POST -d '{}' -H 'Content-Type: application/json' -H "Authorization: Bearer $(cat /var/run/lease/token)" http://proxyfleet.proxyfleet-system.svc:8090/v1/leases`

// runCrawler runs script (sh) in a pod of the crawler image in namespace
// crawlers under service account sa, rotating per request, with $POD set to name, waits until it
// ends and returns its log; a script that fails fails the test with the
// log and the pod's state.
func runCrawler(t *testing.T, c *node.Cluster, name, sa, script string) string {
	t.Helper()
	startCrawler(t, c, name, sa, script)
	return waitCrawler(t, c, name)
}

// startCrawler creates the pod runCrawler runs, without waiting.
func startCrawler(t *testing.T, c *node.Cluster, name, sa, script string) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		// A new Squid for every request (the sidecar is sticky by default).
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "crawlers", Annotations: map[string]string{"proxyfleet.io/rotation": "request"}},
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
