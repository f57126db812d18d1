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
	"github.com/proxyfleet/proxyfleet/internal/testkit/hcloudapi"
	"github.com/proxyfleet/proxyfleet/providers"
	hetznerprovider "github.com/proxyfleet/proxyfleet/providers/hetzner"
)

// TestSweepDeletesThisInstallationsHetznerOrphansOnly runs the sweep on the
// real hetzner provider, on the real hcloud-go client, against the in-test
// Hetzner Cloud API. The project holds a server of this installation whose
// Proxy is gone, a live Proxy's server, another installation's server whose
// UID no Proxy here has, and a server proxyfleet did not make. Past the
// grace period the sweep deletes the orphan alone.
func TestSweepDeletesThisInstallationsHetznerOrphansOnly(t *testing.T) {
	api := hcloudapi.Start(t)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte(hcloudapi.DefaultToken), 0o600); err != nil {
		t.Fatal(err)
	}
	prov, err := hetznerprovider.New(hetznerprovider.Config{Location: "fsn1", Entry: "hetzner-fsn",
		Defaults: providers.Placement{MachineType: "cx22"}, SourceRanges: []string{"203.0.113.0/24"},
		Endpoint: api.Endpoint(), TokenFile: token})
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
	stranger := api.Put(hcloudapi.Server{Name: "web-1", Labels: map[string]string{"app": "web"}})

	rec := &countingRecorder{}
	s := newSweeper(t, Options{
		Reader:    &proxyReader{proxies: []v1alpha1.Proxy{proxyWithUID("uid-live")}},
		Providers: map[string]providers.Provider{"hetzner-fsn": prov},
		Clock:     clocktesting.NewFakeClock(time.Now().Add(time.Hour)),
		MinAge:    10 * time.Minute,
		Recorder:  rec,
	})
	res := s.sweep(testCtx(t))
	if res.errors != 0 {
		t.Fatalf("sweep errors: %+v", res)
	}
	if got := res.deleted["hetzner-fsn"]; len(got) != 1 || got[0].ProviderID != orphan {
		t.Fatalf("deleted %+v, want the orphan %s alone", got, orphan)
	}
	left := map[string]bool{}
	for _, srv := range api.Servers() {
		left["hcloud://"+strconv.FormatInt(srv.ID, 10)] = true
	}
	if left[orphan] || !left[live] || !left[foreign] || !left["hcloud://"+strconv.FormatInt(stranger, 10)] || len(left) != 3 {
		t.Fatalf("servers after the sweep: %v; want the live Proxy's, the other installation's and the stranger's", left)
	}
	if want := map[string]int{"hetzner-fsn/" + providers.PartVM: 1}; !maps.Equal(rec.counts, want) {
		t.Fatalf("counts = %v, want %v", rec.counts, want)
	}
}
