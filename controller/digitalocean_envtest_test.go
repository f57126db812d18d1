package controller

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/internal/testkit/doapi"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
	doprovider "github.com/proxyfleet/proxyfleet/providers/digitalocean"
)

// newDO is the real digitalocean provider on the real godo client, pointed
// at an in-test DigitalOcean API, with the token from a file as a mounted
// Secret holds it; it returns the token file too.
func newDO(t *testing.T) (*doprovider.Provider, *doapi.Server, string) {
	t.Helper()
	srv := doapi.Start(t)
	token := filepath.Join(t.TempDir(), "token")
	writeTestFile(t, token, doapi.DefaultToken)
	prov, err := doprovider.New(doprovider.Config{
		Region: "ams3", Entry: "do-ams",
		Defaults:     providers.Placement{MachineType: "s-1vcpu-512mb-10gb"},
		SourceRanges: []string{"127.0.0.0/8"},
		Endpoint:     srv.URL, TokenFile: token,
	})
	if err != nil {
		t.Fatal(err)
	}
	return prov, srv, token
}

// TestDigitalOceanManagedProxyBootsWithItsOwnLoginAndCleansUp runs a
// Managed Proxy on the real digitalocean provider, the real reconciler and
// the real health engine. DigitalOcean is the in-test API; the droplet's
// Squid is a real Squid on 127.0.0.1 standing in for it, running with the
// htpasswd file the droplet's user-data carries, so the probes reach Ready
// only if they log in with the generated Secret's login.
func TestDigitalOceanManagedProxyBootsWithItsOwnLoginAndCleansUp(t *testing.T) {
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	vmSquid := squid.Start(t, squid.Options{Name: "droplet-squid-stand-in", OutgoingAddr: "127.0.0.46",
		BasicAuth: &squid.Login{Username: "placeholder", Password: "placeholder-" + squid.ServiceName()}})
	prov, srv, _ := newDO(t)
	h := start(t, setup{providers: map[string]providers.Provider{"do-ams": providers.WithMetrics(prov, "do-ams", nopRecorder{})}, engine: &health.Options{}})
	px := gen.Proxy("eu-1", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("do-ams"), gen.SetProxyPort(int32(vmSquid.Port())),
		gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: target.URL() + "/health", IntervalSeconds: 2, TimeoutSeconds: 2}))
	h.create(px)
	p := h.waitProxy("eu-1", "droplet created", func(p *v1alpha1.Proxy) bool { return p.Status.ProviderID != "" })
	all := srv.Droplets()
	if len(all) != 1 || p.Status.ProviderID != "digitalocean://"+strconv.Itoa(all[0].ID) {
		t.Fatalf("providerID = %s, droplets %+v: want the one droplet", p.Status.ProviderID, all)
	}
	d := all[0]
	if d.Name != providers.NameFromUID(string(p.UID)) || !containsAll(d.Tags, "proxyfleet", doprovider.TagOwnerUIDPrefix+string(p.UID), doprovider.TagInstallationPrefix+testInstallation) {
		t.Fatalf("droplet %s tags %v: want the Proxy's name, UID and installation", d.Name, d.Tags)
	}

	// The login Secret, and the droplet's user-data: the bootstrap whose
	// Squid demands that login.
	var s corev1.Secret
	key := types.NamespacedName{Namespace: h.ns, Name: credentials.GeneratedSecretName(p)}
	if err := env.Client.Get(h.ctx(), key, &s); err != nil {
		t.Fatalf("credentials Secret: %v", err)
	}
	user, pass := string(s.Data["username"]), string(s.Data["password"])
	htpasswd := bootstrapPasswordFile(t, d.UserData)
	if u, _, _ := strings.Cut(htpasswd, ":"); u != user || user == "" || strings.Contains(d.UserData, pass) {
		t.Fatalf("the droplet's password file is for user %q, want %q (or the user-data leaks the password)", u, user)
	}
	// The firewall admits the Proxy's port from the source ranges, only.
	fws := srv.Firewalls()
	if len(fws) != 1 || len(fws[0].Inbound) != 1 || fws[0].Inbound[0].Ports != strconv.Itoa(vmSquid.Port()) {
		t.Fatalf("firewalls %+v: want one admitting port %d only", fws, vmSquid.Port())
	}

	vmSquid.Stop()
	vmSquid.SetBasicAuth(&squid.Login{Username: user, Password: pass, Htpasswd: htpasswd})
	vmSquid.Start()

	// DigitalOcean brings the droplet up; the reconciler adopts its public
	// address and the health engine, logging in with the Secret, turns it
	// Ready.
	if got := h.mustGet("eu-1"); got.Status.Phase == v1alpha1.PhaseReady || got.Status.IP != "" {
		t.Fatalf("Proxy %s at %q while its droplet is new", got.Status.Phase, got.Status.IP)
	}
	srv.SetStatus(d.ID, doapi.StatusActive)
	srv.SetAddresses(d.ID, "127.0.0.1", "10.110.0.5", "")
	h.waitProxy("eu-1", "Ready at the public address, probed through the droplet's Squid with its login", func(p *v1alpha1.Proxy) bool {
		return p.Status.IP == "127.0.0.1" && p.Status.Phase == v1alpha1.PhaseReady && p.IsHealthy()
	})
	if target.Count("127.0.0.46") == 0 {
		t.Fatal("Ready, but the probe target never saw a request from the droplet Squid's outgoing address")
	}
	if logs := h.logs.dump(); strings.Contains(logs, pass) || strings.Contains(logs, doapi.DefaultToken) {
		t.Fatal("the controller logged the proxy password or the API token")
	}
	if n := srv.CallCount(doapi.CreateDroplet); n != 1 || len(srv.Droplets()) != 1 {
		t.Fatalf("creates = %d, droplets %d; want 1", n, len(srv.Droplets()))
	}

	// Deleting the Proxy deletes the droplet and the login.
	if err := env.Client.Delete(h.ctx(), p); err != nil {
		t.Fatal(err)
	}
	h.waitGone("eu-1")
	if left := srv.Droplets(); len(left) != 0 {
		t.Fatalf("droplets left: %+v", left)
	}
	if err := env.Client.Get(h.ctx(), key, &s); !apierrors.IsNotFound(err) {
		t.Fatalf("credentials Secret after the Proxy is gone: err = %v, want NotFound", err)
	}
}

// TestDigitalOceanProxyPoolScalesItsDroplets: a ProxyPool of three on the
// digitalocean provider has three droplets; scaled to five it has five;
// scaled back, three, the other two deleted.
func TestDigitalOceanProxyPoolScalesItsDroplets(t *testing.T) {
	prov, srv, _ := newDO(t)
	srv.LaunchRunning("127.0.0.1")
	ph := startPool(t, poolSetup{providers: map[string]providers.Provider{"do-ams": prov}})
	pool := gen.ProxyPool("eu", gen.SetProxyPoolNamespace(ph.ns), gen.SetProxyPoolReplicas(3),
		gen.SetProxyPoolTemplate(gen.Proxy("unused", gen.SetProxyManaged("do-ams")).Spec))
	ph.create(pool)
	running := func(n int) func(*v1alpha1.ProxyPool, []v1alpha1.Proxy) bool {
		return func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
			return settled(n)(p, ps) && len(srv.Droplets()) == n
		}
	}
	for _, n := range []int32{3, 5, 3} {
		if n != 3 || srv.CallCount(doapi.CreateDroplet) > 0 {
			ph.scaleTo("eu", n)
		}
		_, ps := ph.waitPool("eu", "droplets follow the pool", running(int(n)))
		byUID := map[string]bool{}
		for _, d := range srv.Droplets() {
			for _, tag := range d.Tags {
				if uid, ok := strings.CutPrefix(tag, doprovider.TagOwnerUIDPrefix); ok {
					byUID[uid] = true
				}
			}
		}
		for _, px := range ps {
			if !byUID[string(px.UID)] {
				t.Fatalf("at %d replicas Proxy %s has no droplet (droplets %+v)", n, px.Name, srv.Droplets())
			}
		}
	}
	if n := srv.CallCount(doapi.CreateDroplet); n != 5 {
		t.Fatalf("droplets ever created = %d, want 5", n)
	}
}

// TestDigitalOceanRefusalsReachTheProxysCondition: a token DigitalOcean
// does not know fails the Proxy Permanent with its words in the
// Provisioned condition and creates nothing; an account at its droplet
// limit keeps a Proxy waiting on quota, not Failed, with its words too.
func TestDigitalOceanRefusalsReachTheProxysCondition(t *testing.T) {
	prov, srv, token := newDO(t)
	writeTestFile(t, token, "dop_v1_revoked")
	h := start(t, setup{providers: map[string]providers.Provider{"do-ams": prov}})
	h.create(gen.Proxy("bad-token", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("do-ams")))
	h.waitProxy("bad-token", "Failed with DigitalOcean's message", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseFailed && reason(p) == v1alpha1.ReasonPermanentError &&
			strings.Contains(message(p), "401") && strings.Contains(message(p), "Unable to authenticate you")
	})
	if n := srv.CallCount(doapi.CreateDroplet); n != 0 || len(srv.Droplets()) != 0 {
		t.Fatalf("creates %d, droplets %d: a refused token must create nothing", n, len(srv.Droplets()))
	}
	if strings.Contains(h.logs.dump(), "dop_v1_revoked") {
		t.Fatal("the controller logged the token")
	}

	writeTestFile(t, token, doapi.DefaultToken)
	srv.SetDropletLimit(1)
	srv.Put(doapi.Droplet{Name: "web-1"})
	h.create(gen.Proxy("at-limit", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("do-ams")))
	p := h.waitProxy("at-limit", "waiting on quota with DigitalOcean's message", func(p *v1alpha1.Proxy) bool {
		return reason(p) == v1alpha1.ReasonQuotaExceeded && strings.Contains(message(p), "will exceed your droplet limit")
	})
	if p.Status.Phase == v1alpha1.PhaseFailed {
		t.Fatalf("a Proxy at the droplet limit is Failed: %s", describe(p))
	}
}

// bootstrapPasswordFile is the content of the bootstrap's login file in a
// cloud-config.
func bootstrapPasswordFile(t *testing.T, userData string) string {
	t.Helper()
	var cc struct {
		WriteFiles []struct{ Path, Content string } `json:"write_files"`
	}
	if err := yaml.Unmarshal([]byte(userData), &cc); err != nil {
		t.Fatal(err)
	}
	for _, f := range cc.WriteFiles {
		if f.Path == bootstrap.PasswordFilePath {
			return f.Content
		}
	}
	t.Fatalf("no %s in the user-data:\n%s", bootstrap.PasswordFilePath, userData)
	return ""
}

func containsAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// writeTestFile writes a credentials file as a mounted Secret holds it.
func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}
