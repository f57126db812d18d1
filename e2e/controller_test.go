package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
)

// controllerProc is a running `proxyfleet controller`.
type controllerProc struct {
	*testutil.Process
	metricsAddr, probeAddr string
	leaseAPIAddr           string // the lease API, without a token
	statusAddr             string // the status page (--status-listen)
}

// startController runs the real binary against env, restricted to ns, with
// shrunken intervals, on free loopback ports for metrics, probes, the
// lease API and the status page.
func startController(t *testing.T, bin string, env *testenv.Env, ns string, extra ...string) *controllerProc {
	t.Helper()
	kubeconfig := env.WriteKubeconfig(t)
	proc, addrs := testutil.StartProcessOnFreePorts(t, bin, 4, func(addrs []string) testutil.ProcessOptions {
		args := []string{"controller", "--kubeconfig", kubeconfig, "--proxy-namespace", ns,
			"--metrics-listen", addrs[0], "--health-probe-listen", addrs[1], "--lease-api-listen", addrs[2],
			"--status-listen", addrs[3],
			"--requeue-now", "50ms", "--provisioning-poll", "200ms", "--deletion-poll", "200ms", "--drift-poll", "500ms",
			"--log-format", "text",
			// The view is namespace-restricted; this controller is the only
			// user of its providers, so the orphan GC may run on it.
			"--gc-allow-namespaced"}
		return testutil.ProcessOptions{
			Name:            "controller[" + t.Name() + "]",
			Args:            append(args, extra...),
			WaitAddrs:       addrs,
			ExpectCleanExit: true,
		}
	})
	return &controllerProc{Process: proc, metricsAddr: addrs[0], probeAddr: addrs[1], leaseAPIAddr: addrs[2], statusAddr: addrs[3]}
}

// pollTimeout is how long the controller tests wait for a condition:
// generous, because the e2e tests run in parallel on a 2-core CI machine,
// where a controller process can take tens of seconds to start and
// reconcile while the others load it.
const pollTimeout = 90 * time.Second

// waitProxy waits until the Proxy satisfies cond.
func waitProxy(t *testing.T, c client.Client, ns, name, what string, cond func(p *v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	t.Helper()
	var p v1alpha1.Proxy
	poll.Until(t, pollTimeout, name+": "+what, func() error {
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p); err != nil {
			return err
		}
		return poll.Check(cond(&p), "phase=%s ip=%q providerID=%q conditions=%+v", p.Status.Phase, p.Status.IP, p.Status.ProviderID, p.Status.Conditions)
	})
	return &p
}

// httpGet returns the status and body of a GET on a loopback address.
func httpGet(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func provisioned(p *v1alpha1.Proxy) *metav1.Condition {
	return meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned)
}

// TestControllerBinary runs `proxyfleet controller` against a real API server
// with the real kubernetes provider. envtest has no kubelet, so the step that
// marks the Squid Pod Running is a kubelet stand-in writing Pod status, named
// as such below.
func TestControllerBinary(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	c := env.Client
	ctx := context.Background()

	t.Run("with a kubernetes provider", func(t *testing.T) {
		ns, podNS := env.Namespace(t), env.Namespace(t)
		cfgPath := filepath.Join(t.TempDir(), "providers.yaml")
		writeFile(t, cfgPath, "providers:\n  - name: in-cluster\n    type: kubernetes\n    kubernetes:\n      namespace: "+podNS+"\n")
		ctl := startController(t, bin, env, ns, "--providers-config", cfgPath)

		poll.Until(t, pollTimeout, "/readyz", func() error {
			code, body, err := httpGet("http://" + ctl.probeAddr + "/readyz")
			return poll.Check(err == nil && code == http.StatusOK, "%s", fmt.Sprint(code, body, err))
		})

		// External: the address comes from the endpoint, no provider involved.
		ext := gen.Proxy("ext", gen.SetProxyNamespace(ns), gen.SetProxyEndpoint("127.0.0.9", 3128))
		if err := c.Create(ctx, ext); err != nil {
			t.Fatal(err)
		}
		waitProxy(t, c, ns, "ext", "external endpoint", func(p *v1alpha1.Proxy) bool {
			cond := provisioned(p)
			return p.Status.IP == "127.0.0.9" && cond != nil && cond.Reason == v1alpha1.ReasonExternalEndpoint
		})

		// Managed: a Squid Pod named after the Proxy UID appears.
		px := gen.Proxy("px", gen.SetProxyNamespace(ns), gen.SetProxyProvider("in-cluster"))
		if err := c.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		podName := providers.NameFromUID(string(px.UID))
		var pod corev1.Pod
		poll.Until(t, pollTimeout, "Squid Pod "+podName, func() error {
			err := c.Get(ctx, types.NamespacedName{Namespace: podNS, Name: podName}, &pod)
			return poll.Check(err == nil, "%v", err)
		})
		waitProxy(t, c, ns, "px", "Provisioning", func(p *v1alpha1.Proxy) bool {
			return p.Status.ProviderID != "" && p.Status.Phase == v1alpha1.PhaseProvisioning && p.Status.IP == ""
		})

		// Kubelet stand-in: envtest runs no kubelet, so the test writes the
		// status a kubelet would once Squid runs.
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP = "127.0.0.55"
		pod.Status.PodIPs = []corev1.PodIP{{IP: "127.0.0.55"}}
		if err := c.Status().Update(ctx, &pod); err != nil {
			t.Fatalf("kubelet stand-in: %v", err)
		}
		waitProxy(t, c, ns, "px", "running at the Pod IP", func(p *v1alpha1.Proxy) bool {
			cond := provisioned(p)
			return p.Status.IP == "127.0.0.55" && cond != nil && cond.Status == metav1.ConditionTrue
		})

		// A provider the config does not name fails with a message.
		bad := gen.Proxy("bad", gen.SetProxyNamespace(ns), gen.SetProxyProvider("gcp-eu"))
		if err := c.Create(ctx, bad); err != nil {
			t.Fatal(err)
		}
		waitProxy(t, c, ns, "bad", "Failed", func(p *v1alpha1.Proxy) bool {
			cond := provisioned(p)
			return p.Status.Phase == v1alpha1.PhaseFailed && cond != nil && strings.Contains(cond.Message, `"gcp-eu"`)
		})

		// Deleting the Proxy deletes its Pod, then the Proxy goes.
		if err := c.Delete(ctx, px); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, pollTimeout, "Proxy and Pod gone", func() error {
			perr := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "px"}, &v1alpha1.Proxy{})
			podErr := c.Get(ctx, types.NamespacedName{Namespace: podNS, Name: podName}, &corev1.Pod{})
			return poll.Check(client.IgnoreNotFound(perr) == nil && perr != nil && client.IgnoreNotFound(podErr) == nil && podErr != nil,
				"proxy: %v, pod: %v", perr, podErr)
		})

		code, body, err := httpGet("http://" + ctl.metricsAddr + "/metrics")
		if err != nil || code != http.StatusOK || !strings.Contains(body, `controller_runtime_reconcile_total{controller="proxy"`) {
			t.Errorf("metrics: %d %v; want controller-runtime's reconcile counter for the proxy controller", code, err)
		}
		// The Pod was created through the metrics decorator: the provider's
		// own request counter must show it.
		if !strings.Contains(body, `proxyfleet_provider_requests_total{op="create",provider="in-cluster",result="ok"}`) {
			t.Errorf("metrics: no provider create counted for in-cluster in:\n%s", strings.Join(grepLines(body, "proxyfleet_provider_requests_total"), "\n"))
		}
	})

	t.Run("with --leader-elect one replica reconciles and hands over on SIGTERM", func(t *testing.T) {
		ns := env.Namespace(t)
		leaseKey := types.NamespacedName{Namespace: ns, Name: "proxyfleet-controller.proxyfleet.io"}
		holder := func() string {
			var l coordinationv1.Lease
			if err := c.Get(ctx, leaseKey, &l); err != nil || l.Spec.HolderIdentity == nil {
				return ""
			}
			return *l.Spec.HolderIdentity
		}
		first := startController(t, bin, env, ns, "--leader-elect")
		var firstHolder string
		poll.Until(t, pollTimeout, "a Lease held in the Proxy namespace", func() error {
			firstHolder = holder()
			return poll.Check(firstHolder != "", "no holder yet")
		})
		second := startController(t, bin, env, ns, "--leader-elect")
		serve := func(name, host string) {
			t.Helper()
			px := gen.Proxy(name, gen.SetProxyNamespace(ns), gen.SetProxyEndpoint(host, 3128))
			if err := c.Create(ctx, px); err != nil {
				t.Fatal(err)
			}
			waitProxy(t, c, ns, name, "served", func(p *v1alpha1.Proxy) bool { return p.Status.IP == host })
		}
		serve("ext1", "127.0.0.11")
		// The follower waits for the Lease: its controllers never started.
		if strings.Contains(second.Output(), "Starting workers") || !strings.Contains(first.Output(), "Starting workers") {
			t.Fatalf("want only the leader's controllers started; leader started: %v, follower started: %v",
				strings.Contains(first.Output(), "Starting workers"), strings.Contains(second.Output(), "Starting workers"))
		}
		if code, err := first.Stop(); err != nil || code != 0 {
			t.Fatalf("stopping the leader: exit %d, %v", code, err)
		}
		poll.Until(t, pollTimeout, "the follower to take the Lease", func() error {
			h := holder()
			return poll.Check(h != "" && h != firstHolder, "holder %s", h)
		})
		serve("ext2", "127.0.0.12")
	})

	t.Run("without a providers config", func(t *testing.T) {
		ns := env.Namespace(t)
		startController(t, bin, env, ns)
		px := gen.Proxy("px", gen.SetProxyNamespace(ns), gen.SetProxyProvider("in-cluster"))
		if err := c.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		p := waitProxy(t, c, ns, "px", "Failed", func(p *v1alpha1.Proxy) bool { return p.Status.Phase == v1alpha1.PhaseFailed })
		if cond := provisioned(p); cond == nil || !strings.Contains(cond.Message, "--providers-config") {
			t.Errorf("condition %+v should say no providers config was given", cond)
		}
		ext := gen.Proxy("ext", gen.SetProxyNamespace(ns), gen.SetProxyEndpoint("127.0.0.10", 3128))
		if err := c.Create(ctx, ext); err != nil {
			t.Fatal(err)
		}
		waitProxy(t, c, ns, "ext", "served", func(p *v1alpha1.Proxy) bool { return p.Status.IP == "127.0.0.10" })
	})
}
