package controller

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testkit/computeapi"
	"github.com/proxyfleet/proxyfleet/internal/testkit/libvirtd"
	"github.com/proxyfleet/proxyfleet/providers"
	kubeprovider "github.com/proxyfleet/proxyfleet/providers/kubernetes"
	kvmprovider "github.com/proxyfleet/proxyfleet/providers/kvm"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// lostAnswers wraps a real provider so every Create reaches the backend
// and its answer is then lost, as a timeout after the backend accepted the
// request loses it: the instance exists, the Proxy never records it.
type lostAnswers struct {
	providers.Provider
}

func (l lostAnswers) Create(ctx context.Context, req providers.CreateRequest) (providers.Instance, error) {
	if _, err := l.Provider.Create(ctx, req); err != nil {
		return providers.Instance{}, err
	}
	return providers.Instance{}, providertest.ErrClass(providers.ErrTransient, "the answer to the create was lost")
}

func (l lostAnswers) Unwrap() providers.Provider { return l.Provider }

func TestDeletingAProxyThatNeverRecordedItsInstanceDeletesItByItsDerivedID(t *testing.T) {
	t.Parallel()
	h := start(t, setup{})
	h.fake.FailAlways(providers.OpCreate, providertest.ErrClass(providers.ErrTransient, "the answer was lost"))
	h.create(h.managed("px"))
	p := h.waitProxy("px", "Create failing", func(p *v1alpha1.Proxy) bool { return h.fake.Count(providers.OpCreate) >= 1 })
	// What the lost Create made: the instance under the Proxy's name.
	id := providertest.ProviderID(providers.NameFromUID(string(p.UID)))
	h.fake.Put(providers.Instance{ProviderID: id, Name: providers.NameFromUID(string(p.UID)), State: providers.StateRunning, OwnerUID: string(p.UID)})
	h.deleteProxy("px")
	h.waitGone("px")
	if h.fake.Exists(id) {
		t.Fatalf("instance %s left behind by a Proxy that never recorded it (calls: %s)", id, h.fake)
	}
}

func TestDeletingAProxyWhoseProviderCannotDeriveIDsReleasesIt(t *testing.T) {
	t.Parallel()
	provs := map[string]providers.Provider{}
	h := start(t, setup{providers: provs, beforeStart: func(h *harness) {
		// The fake without its ProviderIDFor: an older provider.
		provs[fakeName] = struct{ providers.Provider }{h.fake}
	}})
	h.fake.FailAlways(providers.OpCreate, providertest.ErrClass(providers.ErrTransient, "down"))
	h.create(h.managed("px"))
	h.waitProxy("px", "Create failing", func(p *v1alpha1.Proxy) bool { return h.fake.Count(providers.OpCreate) >= 1 })
	h.deleteProxy("px")
	h.waitGone("px")
	if n := h.fake.Count(providers.OpDelete); n != 0 {
		t.Fatalf("Delete called %d times without a derivable ID", n)
	}
}

// TestKubernetesPodCreatedButNotRecordedIsFoundAndDeleted runs the real
// kubernetes provider against the real API server; every Create's answer
// is lost after the Pod was stored.
func TestKubernetesPodCreatedButNotRecordedIsFoundAndDeleted(t *testing.T) {
	t.Parallel()
	provs := map[string]providers.Provider{}
	h := start(t, setup{providers: provs, beforeStart: func(h *harness) {
		kp, err := kubeprovider.New(env.Client, kubeprovider.Config{Namespace: h.ns})
		if err != nil {
			t.Fatal(err)
		}
		provs["in-cluster"] = lostAnswers{kp}
	}})
	px := h.managed("px")
	px.Spec.Provider, px.Spec.Placement = "in-cluster", nil
	h.create(px)
	p := h.waitProxy("px", "the Pod exists, unrecorded", func(p *v1alpha1.Proxy) bool {
		var pod corev1.Pod
		return p.UID != "" && env.Client.Get(h.ctx(), types.NamespacedName{Namespace: h.ns, Name: providers.NameFromUID(string(p.UID))}, &pod) == nil
	})
	if p.Status.ProviderID != "" {
		t.Fatalf("providerID %q recorded although every answer was lost", p.Status.ProviderID)
	}
	h.deleteProxy("px")
	h.waitGone("px")
	var pod corev1.Pod
	err := env.Client.Get(h.ctx(), types.NamespacedName{Namespace: h.ns, Name: providers.NameFromUID(string(p.UID))}, &pod)
	if !apierrors.IsNotFound(err) && (err != nil || pod.DeletionTimestamp == nil) {
		t.Fatalf("the unrecorded Pod is still there after its Proxy is gone (err %v)", err)
	}
}

func TestGCPInsertWhoseOperationEndsInErrorLeavesNoInstance(t *testing.T) {
	t.Parallel()
	h, srv := startGCP(t, nil)
	srv.FailInsertOperations(
		computeapi.OperationFailure{HTTPStatus: 500, Code: "INTERNAL_ERROR", Message: "Internal error", Leave: true},
		computeapi.OperationFailure{HTTPStatus: 500, Code: "INTERNAL_ERROR", Message: "Internal error", Leave: true},
		computeapi.OperationFailure{HTTPStatus: 500, Code: "INTERNAL_ERROR", Message: "Internal error", Leave: true},
		computeapi.OperationFailure{HTTPStatus: 500, Code: "INTERNAL_ERROR", Message: "Internal error", Leave: true},
	)
	px := h.managed("eu-1")
	px.Spec.Provider, px.Spec.Placement = "gcp-eu", nil
	h.create(px)
	h.waitProxy("eu-1", "insert failed", func(p *v1alpha1.Proxy) bool {
		return strings.Contains(message(p), "INTERNAL_ERROR")
	})
	h.deleteProxy("eu-1")
	h.waitGone("eu-1")
	if left := srv.Instances(); len(left) != 0 {
		t.Fatalf("instances after the Proxy is gone: %v", left)
	}
}

// TestKVMCreateFailingAfterItsVolumesOrItsDomainLeavesNothing runs the
// real kvm provider against a real libvirtd over a real sshd: one Proxy
// whose domain libvirt refuses at define (more vCPUs than the machine
// type takes: the overlay, the seed and the mark exist by then), one whose
// domain libvirt refuses to start (its host's bridge does not exist: the
// domain is defined by then). Once each Proxy is deleted nothing of it is
// on the host.
func TestKVMCreateFailingAfterItsVolumesOrItsDomainLeavesNothing(t *testing.T) {
	host := libvirtd.StartKVMHost(t)
	lvd := host.Libvirtd
	config := strings.Replace(host.Config, "machineTypes: {small: {vcpus: 1, memoryMiB: 256, diskGiB: 1}}",
		"machineTypes: {small: {vcpus: 1, memoryMiB: 256, diskGiB: 1}, toomany: {vcpus: 9999, memoryMiB: 256, diskGiB: 1}}", 1)
	config = strings.Replace(config, "hosts: [{name: local, address: \""+host.SSHD.Addr+"\", pool: "+lvd.PoolName+", network: "+lvd.Network+"}]",
		"hosts: [{name: local, address: \""+host.SSHD.Addr+"\", pool: "+lvd.PoolName+", network: "+lvd.Network+"}, {name: nobridge, address: \""+host.SSHD.Addr+"\", pool: "+lvd.PoolName+", bridge: pfnosuchbr0}]", 1)
	if config == host.Config || !strings.Contains(config, "nobridge") || !strings.Contains(config, "toomany") {
		t.Fatalf("the test could not extend the host's config:\n%s", config)
	}
	cfg, err := providers.ParseConfig([]byte(config), map[string]providers.Decoder{kvmprovider.Type: providers.DecoderOf(kvmprovider.ReadConfig)})
	if err != nil {
		t.Fatalf("providers config: %v\n%s", err, config)
	}
	built, err := providers.NewRegistry(map[string]providers.Constructor{kvmprovider.Type: kvmprovider.Constructor(logr.Discard())}).Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(built["kvm-local"].(*kvmprovider.Provider).Close)
	h := start(t, setup{providers: map[string]providers.Provider{"kvm-local": providers.WithMetrics(built["kvm-local"], "kvm-local", nopRecorder{})}})
	lv := lvd.Connect(t)
	defer func() { _ = lv.Disconnect() }()

	for _, tc := range []struct {
		name      string
		placement v1alpha1.Placement
		refusal   string
	}{
		{"refused-at-define", v1alpha1.Placement{MachineType: "toomany"}, "defining domain"},
		{"refused-at-start", v1alpha1.Placement{Zone: "nobridge"}, "starting domain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := h.managed(tc.name)
			px.Spec.Provider, px.Spec.Placement = "kvm-local", &tc.placement
			h.create(px)
			p := h.waitProxy(tc.name, "Create refused", func(p *v1alpha1.Proxy) bool { return strings.Contains(message(p), tc.refusal) })
			name := providers.NameFromUID(string(p.UID))
			h.deleteProxy(tc.name)
			h.waitGone(tc.name)
			if _, err := lv.DomainLookupByName(name); err == nil {
				t.Fatalf("domain %s is still defined after its Proxy is gone", name)
			}
			if files := lvd.PoolFiles(t); slices.ContainsFunc(files, func(f string) bool { return strings.HasPrefix(f, name) }) {
				t.Fatalf("volumes of %s left in the pool after its Proxy is gone: %v", name, files)
			}
		})
	}
}
