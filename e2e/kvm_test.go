package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/libvirtd"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	kvmprovider "github.com/proxyfleet/proxyfleet/providers/kvm"
)

// TestControllerBinaryRunsAKVMProxy is the kvm provider through the real
// controller binary: its providers config file names a real libvirtd
// (private, in its own namespaces) reached over a real sshd on 127.0.0.1.
// A Managed Proxy gets its domain defined and started — phase Provisioning,
// since the test image boots no OS and never reports an address — and
// deleting the Proxy destroys and undefines the domain and removes its
// volumes, leaving only the cached base image.
func TestControllerBinaryRunsAKVMProxy(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	host := libvirtd.StartKVMHost(t)
	lvd := host.Libvirtd
	config := filepath.Join(t.TempDir(), "providers.yaml")
	writeFile(t, config, host.Config)
	startController(t, bin, env, ns, "--providers-config", config)

	px := gen.Proxy("home-1", gen.SetProxyNamespace(ns), gen.SetProxyManaged("kvm-local"), gen.SetProxyPort(3128))
	if err := env.Client.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	p := waitProxy(t, env.Client, ns, "home-1", "domain defined and started", func(p *v1alpha1.Proxy) bool {
		return p.Status.ProviderID != "" && p.Status.Phase == v1alpha1.PhaseProvisioning
	})
	name := providers.NameFromUID(string(p.UID))
	if want := kvmprovider.FormatProviderID("local", name); p.Status.ProviderID != want {
		t.Fatalf("providerID = %s, want %s", p.Status.ProviderID, want)
	}
	lv := lvd.Connect(t)
	defer func() { _ = lv.Disconnect() }()
	lvd.RequireRunning(t, lv, name)

	if err := env.Client.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, "the Proxy gone", func() error {
		var got v1alpha1.Proxy
		err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "home-1"}, &got)
		return poll.Check(apierrors.IsNotFound(err), "still there: %s", string(got.Status.Phase))
	})
	if _, err := lv.DomainLookupByName(name); err == nil {
		t.Fatal("the domain is still defined after the Proxy is gone")
	}
	poll.Until(t, 30*time.Second, "only the cached base and its marker left in the pool", func() error {
		files := lvd.PoolFiles(t)
		return poll.Check(slices.Equal(files, host.CachedBaseFiles), "pool after delete = %v", files)
	}, poll.Every(200*time.Millisecond))
}
