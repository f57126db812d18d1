package kubernetes

// These tests drive the provider against a real kube-apiserver and etcd
// (envtest, binaries from bin/k8s). There is no kubelet, so nothing runs the
// Pods: the tests write Pod status through the status subresource to stand in
// for one, and read back exactly what the API server stored.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
)

// env is the control plane shared by this package's tests; each test works in
// namespaces of its own.
var env *testenv.Env

// TestMain starts the control plane, unless the run only fuzzes
// (FuzzReadConfig needs none, and every fuzz worker runs TestMain too).
func TestMain(m *testing.M) {
	flag.Parse()
	if fuzzOnly() {
		os.Exit(m.Run())
	}
	testenv.Run(m, &env)
}

// fuzzOnly reports a fuzz worker, or a coordinator told to run no test
// (make fuzz: -run '^$' -fuzz ...).
func fuzzOnly() bool {
	if flag.Lookup("test.fuzzworker").Value.String() == "true" {
		return true
	}
	return flag.Lookup("test.fuzz").Value.String() != "" && flag.Lookup("test.run").Value.String() == "^$"
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newProvider(t *testing.T, c client.Client, ns string) *Provider {
	t.Helper()
	p, err := New(c, Config{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func request(uid string) providers.CreateRequest {
	return providers.CreateRequest{
		Name: providers.NameFromUID(uid), OwnerUID: uid, OwnerName: "px-" + uid, OwnerNamespace: "crawl",
		Port: 3128, Labels: map[string]string{"tier": "dc"},
	}
}

func getPod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	if err := env.Client.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: name}, &pod); err != nil {
		t.Fatalf("get pod %s/%s: %v", ns, name, err)
	}
	return &pod
}

// setStatus stands in for the kubelet: it writes phase and IP through the
// status subresource, as a kubelet would.
func setStatus(t *testing.T, ns, name string, phase corev1.PodPhase, ip string) {
	t.Helper()
	pod := getPod(t, ns, name)
	pod.Status.Phase = phase
	pod.Status.PodIP = ip
	pod.Status.PodIPs = nil
	if ip != "" {
		pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	if err := env.Client.Status().Update(testCtx(t), pod); err != nil {
		t.Fatalf("write pod status %s: %v", phase, err)
	}
}

func TestCreateMakesTheExpectedPod(t *testing.T) {
	ctx := testCtx(t)
	ns := env.Namespace(t)
	p := newProvider(t, env.Client, ns)
	req := request("3f0b2c4e-1a2b-4c3d-9e8f-0123456789ab")

	inst, err := p.Create(ctx, req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if inst.ProviderID != "kubernetes://"+ns+"/proxy-pnutq2sxfx2whg6d" || inst.Name != req.Name ||
		inst.State != providers.StateProvisioning || inst.OwnerUID != req.OwnerUID || inst.CreatedAt.IsZero() {
		t.Fatalf("Create returned %+v", inst)
	}

	pod := getPod(t, ns, req.Name)
	c := pod.Spec.Containers[0]
	if pod.Labels[LabelManagedBy] != "proxyfleet" || pod.Labels[LabelOwnerUID] != req.OwnerUID ||
		pod.Labels[LabelOwnerName] != req.OwnerName || pod.Labels["tier"] != "dc" {
		t.Errorf("stored labels %v", pod.Labels)
	}
	if c.Image != DefaultImage || c.Ports[0].ContainerPort != 3128 || c.ReadinessProbe.TCPSocket.Port.IntValue() != 3128 {
		t.Errorf("stored container %+v", c)
	}
	if !*pod.Spec.SecurityContext.RunAsNonRoot || !*c.SecurityContext.ReadOnlyRootFilesystem || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("stored security settings %+v / %+v", pod.Spec.SecurityContext, c.SecurityContext)
	}
	conf := pod.Annotations[AnnotationSquidConf]
	for _, line := range []string{"http_port 3128", "visible_hostname " + req.Name, "http_access deny CONNECT !SSL_ports", "http_access deny proxyfleet_denied", "forwarded_for delete"} {
		if !strings.Contains(conf, "\n"+line+"\n") {
			t.Errorf("stored squid.conf lacks %q", line)
		}
	}
	// The configuration exactly as the API server stored it is what the
	// kubelet projects into the container: the real Squid must accept it.
	if problems := parseSquidConf(t, conf); len(problems) > 0 {
		t.Errorf("squid rejects the stored config:\n%s", strings.Join(problems, "\n"))
	}
}

func TestCreateLowPortPlacementAndImageAreAccepted(t *testing.T) {
	ctx := testCtx(t)
	ns := env.Namespace(t)
	p := newProvider(t, env.Client, ns)
	req := request("low-port")
	req.Port = 80
	req.Placement = providers.Placement{Zone: "europe-west1-b", MachineType: "e2-small", Image: "ubuntu/squid:6.10-24.10_beta"}
	if _, err := p.Create(ctx, req); err != nil {
		t.Fatalf("Create: %v", err)
	}
	pod := getPod(t, ns, req.Name)
	if s := pod.Spec.SecurityContext.Sysctls; len(s) != 1 || s[0].Name != "net.ipv4.ip_unprivileged_port_start" {
		t.Errorf("stored sysctls %v", s)
	}
	if pod.Spec.NodeSelector[corev1.LabelTopologyZone] != "europe-west1-b" || pod.Spec.Containers[0].Image != req.Placement.Image {
		t.Errorf("placement not applied: %v %s", pod.Spec.NodeSelector, pod.Spec.Containers[0].Image)
	}
}

func TestCreateIsIdempotent(t *testing.T) {
	ctx := testCtx(t)
	ns := env.Namespace(t)
	p := newProvider(t, env.Client, ns)
	req := request("idem")
	first, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	second, err := p.Create(ctx, req)
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if second.ProviderID != first.ProviderID || !second.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("second Create returned %+v, first %+v", second, first)
	}
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil || len(pods.Items) != 1 {
		t.Fatalf("%d pods after two Creates (err %v), want 1", len(pods.Items), err)
	}

	t.Run("a pod of the same name owned by another UID is not adopted", func(t *testing.T) {
		other := req
		other.OwnerUID = "someone-else"
		if _, err := p.Create(ctx, other); !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "belongs to proxy UID") {
			t.Fatalf("err = %v, want ErrPermanent about the owner", err)
		}
	})

	t.Run("an unmanaged pod of the same name is not adopted", func(t *testing.T) {
		squatter := unmanagedPod(ns, providers.NameFromUID("squat"))
		if err := env.Client.Create(ctx, squatter); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Create(ctx, request("squat")); !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "not managed by proxyfleet") {
			t.Fatalf("err = %v, want ErrPermanent", err)
		}
	})

	t.Run("a terminating pod of the same name is transient", func(t *testing.T) {
		req := request("terminating")
		if _, err := p.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
		holdTerminating(t, ns, req.Name)
		if _, err := p.Create(ctx, req); !errors.Is(err, providers.ErrTransient) || !strings.Contains(err.Error(), "terminating") {
			t.Fatalf("err = %v, want ErrTransient", err)
		}
	})
}

func unmanagedPod(ns, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "other"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

// holdTerminating deletes the pod but keeps it around with a finalizer, the
// way a pod on a slow node lingers; the finalizer is removed when t ends.
func holdTerminating(t *testing.T, ns, name string) {
	t.Helper()
	ctx := testCtx(t)
	pod := getPod(t, ns, name)
	pod.Finalizers = append(pod.Finalizers, "proxyfleet.io/test-hold")
	if err := env.Client.Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pod := getPod(t, ns, name)
		pod.Finalizers = nil
		if err := env.Client.Update(context.Background(), pod); err != nil {
			t.Errorf("release finalizer: %v", err)
		}
	})
	if getPod(t, ns, name).DeletionTimestamp == nil {
		t.Fatal("pod is not terminating")
	}
}

func TestGetMapsPodPhases(t *testing.T) {
	ctx := testCtx(t)
	ns := env.Namespace(t)
	p := newProvider(t, env.Client, ns)

	t.Run("a pod's life from creation to running", func(t *testing.T) {
		req := request("lifecycle")
		inst, err := p.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		steps := []struct {
			phase corev1.PodPhase
			ip    string
			want  providers.State
		}{
			{"", "", providers.StateProvisioning},
			{corev1.PodPending, "", providers.StateProvisioning},
			{corev1.PodRunning, "", providers.StateProvisioning},
			{corev1.PodRunning, "10.244.1.7", providers.StateRunning},
			{corev1.PodUnknown, "10.244.1.7", providers.StateProvisioning},
		}
		for _, s := range steps {
			if s.phase != "" {
				setStatus(t, ns, req.Name, s.phase, s.ip)
			}
			got, err := p.Get(ctx, inst.ProviderID)
			if err != nil {
				t.Fatalf("Get in phase %q: %v", s.phase, err)
			}
			if got.State != s.want || got.IP != s.ip || got.OwnerUID != req.OwnerUID || got.ProviderID != inst.ProviderID {
				t.Fatalf("phase %q ip %q: Get = %+v, want state %s", s.phase, s.ip, got, s.want)
			}
		}
	})

	for _, tt := range []struct {
		phase corev1.PodPhase
		want  providers.State
	}{
		{corev1.PodFailed, providers.StateStopped},
		{corev1.PodSucceeded, providers.StateTerminated},
	} {
		t.Run(fmt.Sprintf("%s is %s", tt.phase, tt.want), func(t *testing.T) {
			req := request("final-" + strings.ToLower(string(tt.phase)))
			inst, err := p.Create(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			setStatus(t, ns, req.Name, corev1.PodRunning, "10.244.1.8")
			setStatus(t, ns, req.Name, tt.phase, "10.244.1.8")
			if got, err := p.Get(ctx, inst.ProviderID); err != nil || got.State != tt.want {
				t.Fatalf("Get = %+v, %v; want %s", got, err, tt.want)
			}
		})
	}

	t.Run("a terminating pod is terminated", func(t *testing.T) {
		req := request("going")
		inst, err := p.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		setStatus(t, ns, req.Name, corev1.PodRunning, "10.244.1.9")
		holdTerminating(t, ns, req.Name)
		if got, err := p.Get(ctx, inst.ProviderID); err != nil || got.State != providers.StateTerminated {
			t.Fatalf("Get = %+v, %v; want Terminated", got, err)
		}
	})

	t.Run("a missing pod is not found", func(t *testing.T) {
		if _, err := p.Get(ctx, formatProviderID(ns, "proxy-missing")); providers.Class(err) != providers.ErrNotFound {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
	})

	t.Run("an unmanaged pod is not found", func(t *testing.T) {
		if err := env.Client.Create(ctx, unmanagedPod(ns, "someone-elses")); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Get(ctx, formatProviderID(ns, "someone-elses")); providers.Class(err) != providers.ErrNotFound {
			t.Fatalf("err = %v, want ErrNotFound", err)
		}
	})

	t.Run("a malformed providerID is permanent", func(t *testing.T) {
		if _, err := p.Get(ctx, "zones/europe-west1-b/instances/proxy-x"); providers.Class(err) != providers.ErrPermanent {
			t.Fatalf("err = %v, want ErrPermanent", err)
		}
	})
}

func TestDeleteIsIdempotent(t *testing.T) {
	ctx := testCtx(t)
	ns := env.Namespace(t)
	p := newProvider(t, env.Client, ns)

	t.Run("delete, delete again, then not found", func(t *testing.T) {
		inst, err := p.Create(ctx, request("del"))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if err := p.Delete(ctx, inst.ProviderID); err != nil {
				t.Fatalf("Delete #%d: %v", i+1, err)
			}
		}
		// Unscheduled Pods are removed at once; poll anyway, as the reconciler does.
		poll.Until(t, 30*time.Second, "the pod gone after Delete", func() error {
			_, err := p.Get(ctx, inst.ProviderID)
			return poll.Check(providers.Class(err) == providers.ErrNotFound, "Get: %v", err)
		})
		if err := p.Delete(ctx, inst.ProviderID); err != nil {
			t.Fatalf("Delete of a gone pod: %v", err)
		}
	})

	t.Run("a terminating pod deletes without error", func(t *testing.T) {
		req := request("del-terminating")
		inst, err := p.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		holdTerminating(t, ns, req.Name)
		if err := p.Delete(ctx, inst.ProviderID); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	})

	t.Run("an unmanaged pod is never deleted", func(t *testing.T) {
		if err := env.Client.Create(ctx, unmanagedPod(ns, "keep-me")); err != nil {
			t.Fatal(err)
		}
		if err := p.Delete(ctx, formatProviderID(ns, "keep-me")); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if pod := getPod(t, ns, "keep-me"); pod.DeletionTimestamp != nil {
			t.Fatal("the unmanaged pod was deleted")
		}
	})

	t.Run("a malformed providerID is permanent", func(t *testing.T) {
		if err := p.Delete(ctx, "kubernetes://"+ns); providers.Class(err) != providers.ErrPermanent {
			t.Fatalf("err = %v, want ErrPermanent", err)
		}
	})
}

func TestListByTagFindsOnlyManagedPodsInEveryNamespace(t *testing.T) {
	ctx := testCtx(t)
	nsA, nsB := env.Namespace(t), env.Namespace(t)
	pa := newProvider(t, env.Client, nsA)
	pb := newProvider(t, env.Client, nsB)
	want := map[string]string{} // providerID → owner UID
	for i, p := range []*Provider{pa, pa, pa, pb} {
		req := request(fmt.Sprintf("list-%d-%s", i, nsA))
		inst, err := p.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		want[inst.ProviderID] = req.OwnerUID
	}
	if err := env.Client.Create(ctx, unmanagedPod(nsA, "not-ours")); err != nil {
		t.Fatal(err)
	}
	pa.pageSize = 2 // follow continue tokens across pages

	list, err := pa.ListByTag(ctx)
	if err != nil {
		t.Fatalf("ListByTag: %v", err)
	}
	got := map[string]string{}
	for _, inst := range list {
		if inst.Name == "not-ours" {
			t.Fatal("ListByTag returned an unmanaged pod")
		}
		if inst.CreatedAt.IsZero() || inst.OwnerUID == "" {
			t.Errorf("instance without GC data: %+v", inst)
		}
		if ns := strings.Split(strings.TrimPrefix(inst.ProviderID, "kubernetes://"), "/")[0]; ns == nsA || ns == nsB {
			got[inst.ProviderID] = inst.OwnerUID
		}
	}
	if fmt.Sprint(sortedPairs(got)) != fmt.Sprint(sortedPairs(want)) {
		t.Fatalf("ListByTag in this test's namespaces = %v, want %v", got, want)
	}
}

func sortedPairs(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// restrictedClient talks to the API server as a user without any RBAC grant.
func restrictedClient(t *testing.T) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "proxyfleet-test-nobody"}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCheck(t *testing.T) {
	ctx := testCtx(t)
	ns := env.Namespace(t)

	t.Run("ready when managed pods can be listed cluster-wide", func(t *testing.T) {
		got := newProvider(t, env.Client, ns).Check(ctx)
		if len(got) != 1 || got[0].Target != "apiserver" || !got[0].Ready || got[0].Reason != "OK" || got[0].Details["namespace"] != ns {
			t.Fatalf("Check = %+v", got)
		}
	})

	t.Run("not ready and Forbidden without RBAC", func(t *testing.T) {
		got := newProvider(t, restrictedClient(t), ns).Check(ctx)
		if len(got) != 1 || got[0].Ready || got[0].Reason != "Forbidden" || !strings.Contains(got[0].Message, "forbidden") {
			t.Fatalf("Check = %+v", got)
		}
	})

	t.Run("not ready when the API server is unreachable", func(t *testing.T) {
		cfg := rest.CopyConfig(env.Config)
		cfg.Host = "https://127.0.0.1:1"
		cfg.Timeout = 5 * time.Second
		c, err := client.New(cfg, client.Options{Scheme: env.Scheme, Mapper: env.Client.RESTMapper()})
		if err != nil {
			t.Fatal(err)
		}
		got := newProvider(t, c, ns).Check(ctx)
		if len(got) != 1 || got[0].Ready || got[0].Reason != "Unreachable" {
			t.Fatalf("Check = %+v", got)
		}
	})
}

func TestAPIErrorsClassifyOnTheRealServer(t *testing.T) {
	ctx := testCtx(t)

	t.Run("403 without RBAC is permanent", func(t *testing.T) {
		ns := env.Namespace(t)
		_, err := newProvider(t, restrictedClient(t), ns).Create(ctx, request("forbidden"))
		if providers.Class(err) != providers.ErrPermanent || !strings.Contains(err.Error(), "forbidden") {
			t.Fatalf("err = %v, want ErrPermanent", err)
		}
	})

	t.Run("a missing namespace is transient", func(t *testing.T) {
		_, err := newProvider(t, env.Client, "no-such-namespace").Create(ctx, request("nons"))
		if providers.Class(err) != providers.ErrTransient || !strings.Contains(err.Error(), "does not exist") {
			t.Fatalf("err = %v, want ErrTransient", err)
		}
	})

	t.Run("ResourceQuota: uncounted is transient, exhausted is quota", func(t *testing.T) {
		ns := env.Namespace(t)
		p := newProvider(t, env.Client, ns)
		quota := &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pods"},
			Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}},
		}
		if err := env.Client.Create(ctx, quota); err != nil {
			t.Fatal(err)
		}
		// No quota controller runs under envtest: the test writes the quota's
		// status as it would. The admission plugin reads quotas through an
		// informer, so each step polls until the API server sees the new status.
		writeStatus := func(used corev1.ResourceList) {
			t.Helper()
			var q corev1.ResourceQuota
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(quota), &q); err != nil {
				t.Fatal(err)
			}
			q.Status = corev1.ResourceQuotaStatus{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}, Used: used}
			if err := env.Client.Status().Update(ctx, &q); err != nil {
				t.Fatal(err)
			}
		}
		n := 0
		// awaitClass creates Proxies' pods until one fails with want. Until
		// the admission plugin's informer sees the status just written, a
		// Create may still succeed or fail as the previous status said
		// (stale, nil for none); any other failure fails the test.
		awaitClass := func(want, stale error) error {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for {
				n++
				_, err := p.Create(ctx, request(fmt.Sprintf("quota-%d", n)))
				switch class := providers.Class(err); {
				case class == want:
					return err
				case err != nil && (stale == nil || class != stale):
					t.Fatalf("Create #%d: %v (class %v), want %v", n, err, class, want)
				case time.Now().After(deadline):
					t.Fatalf("Create #%d: still %v after 30s, want %v", n, err, want)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}

		writeStatus(nil) // hard limits known, usage not counted yet
		if err := awaitClass(providers.ErrTransient, nil); !strings.Contains(err.Error(), "status unknown for quota") {
			t.Fatalf("uncounted quota: %v", err)
		}
		writeStatus(corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")})
		if err := awaitClass(providers.ErrQuotaExceeded, providers.ErrTransient); !strings.Contains(err.Error(), "exceeded quota") {
			t.Fatalf("exhausted quota: %v", err)
		}
	})

	t.Run("New rejects a namespace that is not a DNS label", func(t *testing.T) {
		if _, err := New(env.Client, Config{Namespace: "Not_A_Namespace"}); err == nil {
			t.Fatal("New accepted it")
		}
	})
}
