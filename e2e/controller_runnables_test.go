package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	kubeprovider "github.com/proxyfleet/proxyfleet/providers/kubernetes"
)

// TestControllerGCAndProviderHealth runs `proxyfleet controller` cluster-wide
// against a real API server with the real kubernetes provider and checks its
// two leader-only runnables: the orphan GC deletes a Pod whose Proxy is gone
// (and nothing else), and the kubernetes provider's ProviderHealth turns
// Ready with its gauge in the /metrics scrape.
func TestControllerGCAndProviderHealth(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	c := env.Client
	ctx := context.Background()
	ns, podNS := env.Namespace(t), env.Namespace(t)

	// The world before the controller starts, as a crash would leave it:
	// Pods made by the kubernetes provider, one of them for a Proxy that is gone.
	prov, err := kubeprovider.New(c, kubeprovider.Config{Namespace: podNS})
	if err != nil {
		t.Fatal(err)
	}
	live := gen.Proxy("live", gen.SetProxyNamespace(ns), gen.SetProxyEndpoint("127.0.0.9", 3128))
	if err := c.Create(ctx, live); err != nil {
		t.Fatal(err)
	}
	// The binary's installation ID is the cluster's kube-system UID.
	installation, err := controller.InstallationID(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	podOf := func(uid, installation string) providers.Instance {
		inst, err := prov.Create(ctx, providers.CreateRequest{
			Name: providers.NameFromUID(uid), OwnerUID: uid, Installation: installation, OwnerName: "px", OwnerNamespace: ns, Port: 3128,
		})
		if err != nil {
			t.Fatalf("create the Pod of uid %s: %v", uid, err)
		}
		return inst
	}
	podFor := func(uid string) providers.Instance { return podOf(uid, installation) }
	const goneUID = "5a1e0d1e-0000-4000-8000-00000000f00d"
	orphan := podFor(goneUID)
	ofLive := podFor(string(live.UID))
	// Another cluster's controller sharing the backend made this one.
	foreign := podOf("5a1e0d1e-0000-4000-8000-0000000f0e16", "another-cluster")
	untagged := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: "untagged",
			Labels: map[string]string{kubeprovider.LabelManagedBy: kubeprovider.ManagedBy}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "squid", Image: kubeprovider.DefaultImage}}},
	}
	if err := c.Create(ctx, untagged); err != nil {
		t.Fatal(err)
	}
	// A ProviderHealth left by a provider entry that has since been removed.
	stale := &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: "removed-entry",
		Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue}}}
	if err := c.Create(ctx, stale); err != nil {
		t.Fatal(err)
	}

	cfgPath := filepath.Join(t.TempDir(), "providers.yaml")
	writeFile(t, cfgPath, "providers:\n  - name: in-cluster\n    type: kubernetes\n    kubernetes:\n      namespace: "+podNS+"\n")
	kubeconfig := env.WriteKubeconfig(t)
	proc, addrs := testutil.StartProcessOnFreePorts(t, bin, 2, func(addrs []string) testutil.ProcessOptions {
		return testutil.ProcessOptions{
			Name: "controller[" + t.Name() + "]",
			Args: []string{"controller", "--kubeconfig", kubeconfig, "--providers-config", cfgPath,
				"--metrics-listen", addrs[0], "--health-probe-listen", addrs[1], "--status-listen", "0", "--lease-api-listen", "0",
				"--gc-interval", "200ms", "--gc-min-age", "2s", "--provider-check-interval", "10s",
				"--log-format", "text", "--log-level", "debug"},
			WaitAddrs:       addrs,
			ExpectCleanExit: true,
		}
	})
	metricsAddr := addrs[0]

	// Provider health: Ready with its one target, and the gauge in the scrape.
	poll.Until(t, pollTimeout, "ProviderHealth in-cluster Ready", func() error {
		var ph v1alpha1.ProviderHealth
		if err := c.Get(ctx, types.NamespacedName{Name: "in-cluster"}, &ph); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(ph.Status.Conditions, v1alpha1.ConditionReady)
		ok := ph.Status.Ready && ph.Status.Type == "kubernetes" && ph.Status.TargetsReady == "1/1" &&
			cond != nil && cond.Status == metav1.ConditionTrue
		return poll.Check(ok, "%+v", ph.Status)
	})
	poll.Until(t, pollTimeout, "the gauge in the scrape", func() error {
		code, body, err := httpGet("http://" + metricsAddr + "/metrics")
		return poll.Check(err == nil && code == 200 && strings.Contains(body, `proxyfleet_provider_target_up{provider="in-cluster",target="apiserver"} 1`),
			"%s", fmt.Sprint(code, err, grepLines(body, "proxyfleet_provider")))
	})
	if err := c.Get(ctx, types.NamespacedName{Name: "removed-entry"}, &v1alpha1.ProviderHealth{}); client.IgnoreNotFound(err) != nil || err == nil {
		t.Errorf("the stale ProviderHealth was not deleted at start: %v", err)
	}

	// Orphan GC: the orphan goes, once, logged; the others stay through
	// several more sweeps.
	podGone := func(name string) (bool, string) {
		err := c.Get(ctx, types.NamespacedName{Namespace: podNS, Name: name}, &corev1.Pod{})
		return client.IgnoreNotFound(err) == nil && err != nil, fmt.Sprint(err)
	}
	poll.Until(t, pollTimeout, "the orphaned Pod deleted", func() error {
		gone, why := podGone(orphan.Name)
		return poll.Check(gone, "%s", why)
	})
	sweeps := strings.Count(proc.Output(), "orphan GC sweep finished")
	poll.Until(t, pollTimeout, "three more sweeps", func() error {
		n := strings.Count(proc.Output(), "orphan GC sweep finished")
		return poll.Check(n >= sweeps+3, "%d sweeps", n)
	})
	for _, name := range []string{untagged.Name, ofLive.Name, foreign.Name} {
		if gone, _ := podGone(name); gone {
			t.Errorf("Pod %s was deleted; only the orphan may be", name)
		}
	}
	kills := grepLines(proc.Output(), "WARNING: orphan GC deleting")
	if len(kills) != 1 || !strings.Contains(kills[0], orphan.ProviderID) || !strings.Contains(kills[0], goneUID) ||
		!strings.Contains(kills[0], "provider=in-cluster") {
		t.Errorf("want one kill line naming provider, providerID and uid, got %q", kills)
	}
}

// grepLines returns the lines of s containing sub.
func grepLines(s, sub string) []string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return out
}
