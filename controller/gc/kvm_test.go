package gc

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testkit/libvirtd"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	kvmprovider "github.com/proxyfleet/proxyfleet/providers/kvm"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// countingRecorder is a Recorder that keeps its counts by provider/kind.
type countingRecorder struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *countingRecorder) OrphanDeleted(provider, kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[string]int{}
	}
	c.counts[provider+"/"+kind]++
}

func TestSweepCountsEveryPartItRemoves(t *testing.T) {
	half := inst("a/half", "uid-gone-1", time.Hour)
	half.Parts = []string{providers.PartOverlay, providers.PartSeed, providers.PartMark}
	whole := inst("a/whole", "uid-gone-2", time.Hour)
	whole.Parts = []string{providers.PartDomain, providers.PartOverlay, providers.PartSeed, providers.PartMark}
	plain := inst("b/plain", "uid-gone-3", time.Hour)
	rec := &countingRecorder{}
	s := newSweeper(t, Options{
		Reader:    &proxyReader{},
		Providers: map[string]providers.Provider{"kvm": providertest.NewWith(half, whole), "other": providertest.NewWith(plain)},
		Clock:     clocktesting.NewFakeClock(t0),
		Recorder:  rec,
	})
	s.sweep(context.Background())
	want := map[string]int{"kvm/domain": 1, "kvm/overlay": 2, "kvm/seed": 2, "kvm/mark": 2, "other/" + KindInstance: 1}
	if !maps.Equal(rec.counts, want) {
		t.Fatalf("counts = %v, want %v", rec.counts, want)
	}
}

// TestSweepRemovesAKVMGuestsLeftoversByTheirMarkAndNothingElse runs the
// sweep on the real kvm provider against a real libvirtd over a real
// sshd. The host holds a stopped domain with proxyfleet's mark, the
// overlay, seed and mark a Delete cut off after its undefine left (no
// domain), a live Proxy's guest, and volumes proxyfleet did not make (one
// named like a guest's overlay, without a mark). The sweep, past the grace
// period, removes the first two whole and counts them per kind, and leaves
// the rest.
func TestSweepRemovesAKVMGuestsLeftoversByTheirMarkAndNothingElse(t *testing.T) {
	host := libvirtd.StartKVMHost(t)
	lvd := host.Libvirtd
	cfg, err := providers.ParseConfig([]byte(host.Config), map[string]providers.Decoder{kvmprovider.Type: providers.DecoderOf(kvmprovider.ReadConfig)})
	if err != nil {
		t.Fatal(err)
	}
	built, err := providers.NewRegistry(map[string]providers.Constructor{kvmprovider.Type: kvmprovider.Constructor(logr.Discard())}).Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prov := built["kvm-local"].(*kvmprovider.Provider)
	t.Cleanup(prov.Close)
	req := func(uid string) providers.CreateRequest {
		return providers.CreateRequest{Name: providers.NameFromUID(uid), OwnerUID: uid, Installation: testInstallation, OwnerName: "px", OwnerNamespace: "crawl", Port: 3128,
			ProxyAuth: &providers.BasicAuth{Username: "proxyfleet", Password: "s3cret-" + uid}}
	}
	stopped, stray, live := req("uid-stopped"), req("uid-stray"), req("uid-live")
	for _, r := range []providers.CreateRequest{stopped, stray, live} {
		// A transient failure is retried, as the reconciler retries it: a
		// small download through libvirt's stream (the base image's digest
		// marker) hangs now and then, about one in fifty here. Each attempt
		// has a deadline of its own, as each reconcile pass has: one
		// context for all of them expired under load before the third
		// Create, and every retry then failed at once waiting for the
		// connection.
		err := poll.Wait(2*time.Minute, "the Create of "+r.Name, func() error {
			_, err := prov.Create(testCtx(t), r)
			if err != nil && providers.Class(err) != providers.ErrTransient {
				t.Fatalf("Create %s: %v", r.Name, err)
			}
			return err
		})
		if err != nil {
			t.Fatalf("Create %s: %v", r.Name, err)
		}
	}
	lv := lvd.Connect(t)
	defer func() { _ = lv.Disconnect() }()
	dom, err := lv.DomainLookupByName(stopped.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := lv.DomainDestroy(dom); err != nil {
		t.Fatal(err)
	}
	if dom, err = lv.DomainLookupByName(stray.Name); err != nil {
		t.Fatal(err)
	}
	if err := lv.DomainDestroy(dom); err != nil {
		t.Fatal(err)
	}
	if err := lv.DomainUndefineFlags(dom, libvirt.DomainUndefineNvram); err != nil {
		t.Fatal(err)
	}
	pool, err := lv.StoragePoolLookupByName(lvd.PoolName)
	if err != nil {
		t.Fatal(err)
	}
	unmarked := []string{providers.NameFromUID("uid-nobody") + ".qcow2", "someones-data.qcow2"}
	// What another installation sharing the host left of a guest (its mark
	// and overlay): never this installation's orphan.
	foreignGuest := providers.NameFromUID("uid-foreign")
	foreign := []string{foreignGuest + ".uid-foreign.1700000000.i-another-cluster.mark", foreignGuest + ".qcow2"}
	for _, n := range append(slices.Clone(unmarked), foreign...) {
		if _, err := lv.StorageVolCreateXML(pool, `<volume type="file"><name>`+n+`</name><capacity unit="bytes">4096</capacity><target><format type="raw"/></target></volume>`, 0); err != nil {
			t.Fatal(err)
		}
	}

	rec := &countingRecorder{}
	s := newSweeper(t, Options{
		Reader:    &proxyReader{proxies: []v1alpha1.Proxy{proxyWithUID("uid-live")}},
		Providers: map[string]providers.Provider{"kvm-local": prov},
		Clock:     clocktesting.NewFakeClock(time.Now().Add(time.Hour)),
		MinAge:    10 * time.Minute,
		Recorder:  rec,
	})
	res := s.sweep(testCtx(t))
	if res.errors != 0 {
		t.Fatalf("sweep errors: %+v", res)
	}
	for _, gone := range []string{stopped.Name, stray.Name} {
		if _, err := lv.DomainLookupByName(gone); err == nil {
			t.Errorf("domain %s survived the sweep", gone)
		}
	}
	lvd.RequireRunning(t, lv, live.Name)
	files := lvd.PoolFiles(t)
	for _, f := range files {
		if strings.HasPrefix(f, stopped.Name) || strings.HasPrefix(f, stray.Name) {
			t.Errorf("volume %s survived the sweep: %v", f, files)
		}
	}
	for _, n := range append(append(unmarked, foreign...), live.Name+".qcow2", live.Name+"-seed.iso") {
		if !slices.Contains(files, n) {
			t.Errorf("volume %s was removed by the sweep: %v", n, files)
		}
	}
	want := map[string]int{"kvm-local/domain": 1, "kvm-local/overlay": 2, "kvm-local/seed": 2, "kvm-local/mark": 2}
	if !maps.Equal(rec.counts, want) {
		t.Fatalf("counts = %v, want %v", rec.counts, want)
	}
}
