package gc

import (
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testkit/doapi"
	"github.com/proxyfleet/proxyfleet/providers"
	doprovider "github.com/proxyfleet/proxyfleet/providers/digitalocean"
)

// TestSweepDeletesThisInstallationsDigitalOceanOrphansOnly runs the sweep
// on the real digitalocean provider, on the real godo client, against the
// in-test DigitalOcean API. The account holds a droplet of this
// installation whose Proxy is gone, a live Proxy's droplet, another
// installation's droplet whose UID no Proxy here has, and a droplet
// proxyfleet did not make. Past the grace period the sweep deletes the
// orphan alone.
func TestSweepDeletesThisInstallationsDigitalOceanOrphansOnly(t *testing.T) {
	srv := doapi.Start(t)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte(doapi.DefaultToken), 0o600); err != nil {
		t.Fatal(err)
	}
	prov, err := doprovider.New(doprovider.Config{Region: "ams3", Entry: "do-ams",
		Defaults: providers.Placement{MachineType: "s-1vcpu-512mb-10gb"}, SourceRanges: []string{"203.0.113.0/24"},
		Endpoint: srv.URL, TokenFile: token})
	if err != nil {
		t.Fatal(err)
	}
	create := func(uid, installation string) string {
		inst, err := prov.Create(testCtx(t), providers.CreateRequest{Name: providers.NameFromUID(uid), OwnerUID: uid, Installation: installation,
			OwnerName: "px", OwnerNamespace: "crawl", Port: 3128, ProxyAuth: &providers.BasicAuth{Username: "proxyfleet", Password: "s3cret-" + uid}})
		if err != nil {
			t.Fatalf("Create %s: %v", uid, err)
		}
		return inst.ProviderID
	}
	orphan := create("uid-orphan", testInstallation)
	live := create("uid-live", testInstallation)
	foreign := create("uid-foreign", "another-cluster")
	stranger := srv.Put(doapi.Droplet{Name: "web-1", Tags: []string{"web"}})

	rec := &countingRecorder{}
	s := newSweeper(t, Options{
		Reader:    &proxyReader{proxies: []v1alpha1.Proxy{proxyWithUID("uid-live")}},
		Providers: map[string]providers.Provider{"do-ams": prov},
		Clock:     clocktesting.NewFakeClock(time.Now().Add(time.Hour)),
		MinAge:    10 * time.Minute,
		Recorder:  rec,
	})
	res := s.sweep(testCtx(t))
	if res.errors != 0 {
		t.Fatalf("sweep errors: %+v", res)
	}
	if got := res.deleted["do-ams"]; len(got) != 1 || got[0].ProviderID != orphan {
		t.Fatalf("deleted %+v, want the orphan %s alone", got, orphan)
	}
	left := map[string]bool{}
	for _, d := range srv.Droplets() {
		left["digitalocean://"+strconv.Itoa(d.ID)] = true
	}
	if left[orphan] || !left[live] || !left[foreign] || !left["digitalocean://"+strconv.Itoa(stranger)] || len(left) != 3 {
		t.Fatalf("droplets after the sweep: %v; want the live Proxy's, the other installation's and the stranger's", left)
	}
	if want := map[string]int{"do-ams/" + providers.PartVM: 1}; !maps.Equal(rec.counts, want) {
		t.Fatalf("counts = %v, want %v", rec.counts, want)
	}
}
