package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/libvirtd"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
)

// TestKVMCreateInterruptedByKillingTheControllerIsFinishedByTheNext kills
// the real controller binary with SIGKILL while its Create of a kvm guest
// is in flight against the real libvirtd (no providerID recorded yet) at
// three points: once the guest's mark volume exists, once its overlay
// exists, once its domain is defined. Each time another controller started
// after it must finish the guest (one running domain under the Proxy's
// name), and deleting the Proxy must then leave nothing of the guest in the
// pool.
func TestKVMCreateInterruptedByKillingTheControllerIsFinishedByTheNext(t *testing.T) {
	for _, stage := range []struct {
		name string
		cut  func(lv *libvirt.Libvirt, guest []string, name string) bool
	}{
		{"after the mark volume", func(_ *libvirt.Libvirt, guest []string, _ string) bool { return len(guest) > 0 }},
		{"after the overlay", func(_ *libvirt.Libvirt, guest []string, _ string) bool {
			return slices.ContainsFunc(guest, func(f string) bool { return !strings.HasSuffix(f, ".mark") })
		}},
		{"after the domain is defined", func(lv *libvirt.Libvirt, _ []string, name string) bool {
			_, err := lv.DomainLookupByName(name)
			return err == nil
		}},
	} {
		t.Run(stage.name, func(t *testing.T) { testKVMKilledMidCreate(t, stage.cut) })
	}
}

func testKVMKilledMidCreate(t *testing.T, cut func(lv *libvirt.Libvirt, guest []string, name string) bool) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	host := libvirtd.StartKVMHost(t)
	lvd := host.Libvirtd
	config := filepath.Join(t.TempDir(), "providers.yaml")
	writeFile(t, config, host.Config)
	first := startController(t, bin, env, ns, "--providers-config", config)

	px := gen.Proxy("home-1", gen.SetProxyNamespace(ns), gen.SetProxyManaged("kvm-local"), gen.SetProxyPort(3128))
	if err := env.Client.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	name := providers.NameFromUID(string(px.UID))
	guestFiles := func() []string {
		var out []string
		for _, f := range lvd.PoolFiles(t) {
			if strings.HasPrefix(f, name) {
				out = append(out, f)
			}
		}
		return out
	}
	lv := lvd.Connect(t)
	defer func() { _ = lv.Disconnect() }()
	// A quick interval: the point to cut at may last only a moment.
	poll.Until(t, pollTimeout, "the Create of guest "+name+" to reach the point to cut it at", func() error {
		return poll.Check(cut(lv, guestFiles(), name), "not there yet")
	}, poll.Every(2*time.Millisecond), poll.Report(func() string { return fmt.Sprintf("pool: %v", lvd.PoolFiles(t)) }))
	if err := first.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	left := guestFiles()
	var got v1alpha1.Proxy
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "home-1"}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.ProviderID != "" {
		t.Fatalf("the Create had finished (providerID %s) before the kill; the test wants it cut off", got.Status.ProviderID)
	}
	t.Logf("controller killed mid-Create; the guest's files left: %v", left)

	startController(t, bin, env, ns, "--providers-config", config)
	p := waitProxy(t, env.Client, ns, "home-1", "the next controller finishes the guest", func(p *v1alpha1.Proxy) bool {
		return p.Status.ProviderID != "" && p.Status.Phase == v1alpha1.PhaseProvisioning
	})
	lvd.RequireRunning(t, lv, name)
	doms, _, err := lv.ConnectListAllDomains(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(doms) != 1 || doms[0].Name != name {
		t.Fatalf("domains after the second controller: %v, want only %s", doms, name)
	}

	if err := env.Client.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, "the Proxy gone", func() error {
		err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "home-1"}, &got)
		return poll.Check(apierrors.IsNotFound(err), "still there: %s", string(got.Status.Phase))
	})
	poll.Until(t, pollTimeout, "nothing of the guest left in the pool", func() error {
		files := guestFiles()
		return poll.Check(len(files) == 0, "%s", strings.Join(files, " "))
	})
	if _, err := lv.DomainLookupByName(name); err == nil {
		t.Fatal("the domain is still defined after the Proxy is gone")
	}
}
