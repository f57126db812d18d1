package gc

// The GC against a real kube-apiserver and etcd (envtest) with the real
// kubernetes provider: Proxies are real objects read through a real manager's
// cache, instances are real Pods the provider lists and deletes. There is no
// kubelet, so the Pods never run; the GC does not care.

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	kubeprovider "github.com/proxyfleet/proxyfleet/providers/kubernetes"
)

// env is the package's one real API server. The GC lists managed Pods
// cluster-wide, so the tests that run a sweeper against it are not parallel.
var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

const wait = 30 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	t.Cleanup(cancel)
	return ctx
}

// createProxy creates px (built with gen.Proxy: External, so it needs
// no provider) and returns it with its UID.
func createProxy(t *testing.T, px *v1alpha1.Proxy) *v1alpha1.Proxy {
	t.Helper()
	if err := env.Client.Create(testCtx(t), px); err != nil {
		t.Fatalf("create proxy %s: %v", px.Name, err)
	}
	return px
}

// instanceFor makes the provider create the Pod a Managed Proxy with uid
// would have, exactly as the reconciler asks for it.
func instanceFor(t *testing.T, p providers.Provider, uid string) providers.Instance {
	t.Helper()
	return instanceOf(t, p, uid, testInstallation)
}

// instanceOf is instanceFor made by the installation given.
func instanceOf(t *testing.T, p providers.Provider, uid, installation string) providers.Instance {
	t.Helper()
	inst, err := p.Create(testCtx(t), providers.CreateRequest{
		Name: providers.NameFromUID(uid), OwnerUID: uid, Installation: installation, OwnerName: "px", OwnerNamespace: "crawl", Port: 3128,
	})
	if err != nil {
		t.Fatalf("provider Create for uid %s: %v", uid, err)
	}
	return inst
}

// untaggedPod is a Pod marked managed-by proxyfleet but without the owner UID
// label: nothing proves which Proxy, if any, it belongs to.
func untaggedPod(t *testing.T, ns string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "untagged", Namespace: ns,
			Labels: map[string]string{kubeprovider.LabelManagedBy: kubeprovider.ManagedBy}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "squid", Image: kubeprovider.DefaultImage}}},
	}
	if err := env.Client.Create(testCtx(t), pod); err != nil {
		t.Fatalf("create untagged pod: %v", err)
	}
	return pod
}

func podExists(t *testing.T, ns, name string) bool {
	t.Helper()
	var pod corev1.Pod
	err := env.Client.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: name}, &pod)
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatalf("get pod %s/%s: %v", ns, name, err)
	}
	// The API server removes a Pod that was never scheduled at once; a
	// deletionTimestamp would mean it is on its way out all the same.
	return pod.DeletionTimestamp == nil
}

func TestSweeperOnTheRealAPIServer(t *testing.T) {
	ns := env.Namespace(t)
	prov, err := kubeprovider.New(env.Client, kubeprovider.Config{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	const hold = "test.proxyfleet.io/hold"
	live := createProxy(t, gen.Proxy("live", gen.SetProxyNamespace(ns)))
	// The finalizer keeps it around after the delete.
	deleting := createProxy(t, gen.Proxy("deleting", gen.SetProxyNamespace(ns), gen.SetProxyFinalizers(hold)))
	if err := env.Client.Delete(testCtx(t), deleting); err != nil {
		t.Fatalf("delete proxy: %v", err)
	}
	t.Cleanup(func() {
		// Release the held Proxy so nothing lingers for later tests.
		var px v1alpha1.Proxy
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(deleting), &px); err == nil {
			px.Finalizers = nil
			_ = env.Client.Update(context.Background(), &px)
		}
	})

	orphan := instanceFor(t, prov, "0e5c6c1e-0000-4000-8000-00000000dead")
	ofLive := instanceFor(t, prov, string(live.UID))
	// Another cluster's controller sharing the backend made this one for a
	// Proxy this cluster has never seen.
	foreign := instanceOf(t, prov, "0e5c6c1e-0000-4000-8000-0000000f0e16", "another-cluster")
	ofDeleting := instanceFor(t, prov, string(deleting.UID))
	untagged := untaggedPod(t, ns)

	// Phase 1: every instance is younger than MinAge, so repeated sweeps
	// delete nothing — not even the orphan.
	youngLogs := &testutil.LogLines{}
	young := Options{
		Providers: map[string]providers.Provider{"in-cluster": prov},
		Interval:  200 * time.Millisecond, MinAge: time.Hour, Logger: youngLogs.Logger(),
	}
	stopYoung := startSweeper(t, young)
	poll.Until(t, wait, "three sweeps with a one-hour MinAge", func() error {
		n := len(youngLogs.Matching("orphan GC sweep finished"))
		return poll.Check(n >= 3, "%d sweeps", n)
	})
	stopYoung()
	if !podExists(t, ns, orphan.Name) {
		t.Fatalf("the orphan was deleted while younger than MinAge; log:\n%s", youngLogs.String())
	}
	if kills := youngLogs.Matching("WARNING:"); len(kills) != 0 {
		t.Fatalf("young instances were killed: %v", kills)
	}

	// Phase 2: MinAge shrinks to a second. The orphan goes; the untagged Pod,
	// the live Proxy's Pod and the Pod of the Proxy being deleted stay.
	logs := &testutil.LogLines{}
	s := Options{
		Providers: map[string]providers.Provider{"in-cluster": prov},
		Interval:  200 * time.Millisecond, MinAge: time.Second, Logger: logs.Logger(),
	}
	startSweeper(t, s)
	poll.Until(t, wait, "the orphaned Pod to be deleted", func() error {
		return poll.Check(!podExists(t, ns, orphan.Name), "pod %s still exists", orphan.Name)
	})
	if len(logs.Matching("WARNING:", `"provider"="in-cluster"`, `"providerID"="`+orphan.ProviderID+`"`,
		`"uid"="0e5c6c1e-0000-4000-8000-00000000dead"`)) != 1 {
		t.Errorf("the kill was not logged once with provider, providerID and uid:\n%s", logs.String())
	}
	// Let several more sweeps run over the survivors.
	after := len(logs.Matching("orphan GC sweep finished"))
	poll.Until(t, wait, "three more sweeps", func() error {
		n := len(logs.Matching("orphan GC sweep finished"))
		return poll.Check(n >= after+3, "%d sweeps, %d before", n, after)
	})
	for what, name := range map[string]string{
		"the untagged Pod":                       untagged.Name,
		"the live Proxy's Pod":                   ofLive.Name,
		"the Pod of a Proxy still being deleted": ofDeleting.Name,
		"another installation's Pod":             foreign.Name,
	} {
		if !podExists(t, ns, name) {
			t.Errorf("%s (%s) was deleted; log:\n%s", what, name, logs.String())
		}
	}
	if kills := logs.Matching("WARNING:"); len(kills) != 1 {
		t.Errorf("want exactly one kill, got %d: %v", len(kills), kills)
	}
}

// startSweeper starts a real manager (cache-backed reader, no leader
// election) with a Sweeper of o, reading through the manager's cache, added
// as a runnable. The returned stop also runs when the test ends.
func startSweeper(t *testing.T, o Options) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:  env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Logger:  o.Logger,
	})
	if err != nil {
		t.Fatalf("new manager: %v", err)
	}
	o.Reader = mgr.GetClient()
	if err := mgr.Add(newSweeper(t, o)); err != nil {
		t.Fatalf("add sweeper: %v", err)
	}
	return testutil.RunUntilCleanup(t, "manager", wait, mgr.Start)
}
