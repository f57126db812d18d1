package controller

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/internal/testkit/hcloudapi"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/providers"
	hetznerprovider "github.com/proxyfleet/proxyfleet/providers/hetzner"
)

// newHetzner is the real hetzner provider on the real hcloud-go client,
// pointed at an in-test Hetzner Cloud API, with the token from a file as a
// mounted Secret holds it; it returns the token file too.
func newHetzner(t *testing.T) (*hetznerprovider.Provider, *hcloudapi.API, string) {
	t.Helper()
	api := hcloudapi.Start(t)
	token := filepath.Join(t.TempDir(), "token")
	writeTestFile(t, token, hcloudapi.DefaultToken)
	prov, err := hetznerprovider.New(hetznerprovider.Config{
		Location: "fsn1", Entry: "hetzner-fsn",
		Defaults:     providers.Placement{MachineType: "cx22"},
		SourceRanges: []string{"127.0.0.0/8"},
		Endpoint:     api.Endpoint(), TokenFile: token,
	})
	if err != nil {
		t.Fatal(err)
	}
	return prov, api, token
}

// TestHetznerManagedProxyBootsWithItsOwnLoginAndCleansUp runs a Managed
// Proxy on the real hetzner provider, the real reconciler and the real
// health engine. Hetzner Cloud is the in-test API; the server's Squid is a
// real Squid on 127.0.0.1 standing in for it, running with the htpasswd
// file the server's user-data carries, so the probes reach Ready only if
// they log in with the generated Secret's login.
func TestHetznerManagedProxyBootsWithItsOwnLoginAndCleansUp(t *testing.T) {
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	vmSquid := squid.Start(t, squid.Options{Name: "hcloud-squid-stand-in", OutgoingAddr: "127.0.0.47",
		BasicAuth: &squid.Login{Username: "placeholder", Password: "placeholder-" + squid.ServiceName()}})
	prov, api, _ := newHetzner(t)
	h := start(t, setup{providers: map[string]providers.Provider{"hetzner-fsn": providers.WithMetrics(prov, "hetzner-fsn", nopRecorder{})}, engine: &health.Options{}})
	px := gen.Proxy("eu-1", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("hetzner-fsn"), gen.SetProxyPort(int32(vmSquid.Port())),
		gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: target.URL() + "/health", IntervalSeconds: 2, TimeoutSeconds: 2}))
	h.create(px)
	p := h.waitProxy("eu-1", "server created", func(p *v1alpha1.Proxy) bool { return p.Status.ProviderID != "" })
	all := api.Servers()
	if len(all) != 1 || p.Status.ProviderID != "hcloud://"+strconv.FormatInt(all[0].ID, 10) {
		t.Fatalf("providerID = %s, servers %+v: want the one server", p.Status.ProviderID, all)
	}
	s := all[0]
	if s.Name != providers.NameFromUID(string(p.UID)) || s.Labels[hetznerprovider.LabelOwnerUID] != string(p.UID) ||
		s.Labels[hetznerprovider.LabelInstallation] != testInstallation || s.Labels[hetznerprovider.LabelProxyName] != "eu-1" {
		t.Fatalf("server %s labels %v: want the Proxy's name, UID and installation", s.Name, s.Labels)
	}

	// The login Secret, and the server's user-data: the bootstrap whose
	// Squid demands that login.
	var sec corev1.Secret
	key := types.NamespacedName{Namespace: h.ns, Name: credentials.GeneratedSecretName(p)}
	if err := env.Client.Get(h.ctx(), key, &sec); err != nil {
		t.Fatalf("credentials Secret: %v", err)
	}
	user, pass := string(sec.Data["username"]), string(sec.Data["password"])
	htpasswd := bootstrapPasswordFile(t, s.UserData)
	if u, _, _ := strings.Cut(htpasswd, ":"); u != user || user == "" || strings.Contains(s.UserData, pass) {
		t.Fatalf("the server's password file is for user %q, want %q (or the user-data leaks the password)", u, user)
	}
	// The firewall, applied from the create, admits the Proxy's port only.
	fws := api.Firewalls()
	if len(fws) != 1 || len(fws[0].Rules) != 1 || fws[0].Rules[0].Port != strconv.Itoa(vmSquid.Port()) || len(s.Firewalls) != 1 || s.Firewalls[0] != fws[0].ID {
		t.Fatalf("firewalls %+v, server's %v: want one admitting port %d only, applied", fws, s.Firewalls, vmSquid.Port())
	}

	vmSquid.Stop()
	vmSquid.SetBasicAuth(&squid.Login{Username: user, Password: pass, Htpasswd: htpasswd})
	vmSquid.Start()

	if got := h.mustGet("eu-1"); got.Status.Phase == v1alpha1.PhaseReady || got.Status.IP != "" {
		t.Fatalf("Proxy %s at %q while its server initializes", got.Status.Phase, got.Status.IP)
	}
	api.SetStatus(s.ID, hcloudapi.StatusRunning)
	api.SetAddresses(s.ID, "127.0.0.1", "2001:db8:1:2::/64")
	h.waitProxy("eu-1", "Ready at the public address, probed through the server's Squid with its login", func(p *v1alpha1.Proxy) bool {
		return p.Status.IP == "127.0.0.1" && p.Status.Phase == v1alpha1.PhaseReady && p.IsHealthy()
	})
	if target.Count("127.0.0.47") == 0 {
		t.Fatal("Ready, but the probe target never saw a request from the server Squid's outgoing address")
	}
	if logs := h.logs.dump(); strings.Contains(logs, pass) || strings.Contains(logs, hcloudapi.DefaultToken) {
		t.Fatal("the controller logged the proxy password or the API token")
	}
	if n := api.CallCount(hcloudapi.CreateServer); n != 1 || len(api.Servers()) != 1 {
		t.Fatalf("creates = %d, servers %d; want 1", n, len(api.Servers()))
	}

	// Deleting the Proxy deletes the server and the login.
	if err := env.Client.Delete(h.ctx(), p); err != nil {
		t.Fatal(err)
	}
	h.waitGone("eu-1")
	if left := api.Servers(); len(left) != 0 {
		t.Fatalf("servers left: %+v", left)
	}
	if err := env.Client.Get(h.ctx(), key, &sec); !apierrors.IsNotFound(err) {
		t.Fatalf("credentials Secret after the Proxy is gone: err = %v, want NotFound", err)
	}
}

// TestHetznerProxyPoolScalesItsServers: a ProxyPool of three on the
// hetzner provider has three servers; scaled to five it has five; scaled
// back, three, the other two deleted.
func TestHetznerProxyPoolScalesItsServers(t *testing.T) {
	prov, api, _ := newHetzner(t)
	api.LaunchRunning("127.0.0.1")
	ph := startPool(t, poolSetup{providers: map[string]providers.Provider{"hetzner-fsn": prov}})
	pool := gen.ProxyPool("eu", gen.SetProxyPoolNamespace(ph.ns), gen.SetProxyPoolReplicas(3),
		gen.SetProxyPoolTemplate(gen.Proxy("unused", gen.SetProxyManaged("hetzner-fsn")).Spec))
	ph.create(pool)
	running := func(n int) func(*v1alpha1.ProxyPool, []v1alpha1.Proxy) bool {
		return func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
			return settled(n)(p, ps) && len(api.Servers()) == n
		}
	}
	for _, n := range []int32{3, 5, 3} {
		if n != 3 || api.CallCount(hcloudapi.CreateServer) > 0 {
			ph.scaleTo("eu", n)
		}
		_, ps := ph.waitPool("eu", "servers follow the pool", running(int(n)))
		byUID := map[string]bool{}
		for _, s := range api.Servers() {
			byUID[s.Labels[hetznerprovider.LabelOwnerUID]] = true
		}
		for _, px := range ps {
			if !byUID[string(px.UID)] {
				t.Fatalf("at %d replicas Proxy %s has no server (servers %+v)", n, px.Name, api.Servers())
			}
		}
	}
	if n := api.CallCount(hcloudapi.CreateServer); n != 5 {
		t.Fatalf("servers ever created = %d, want 5", n)
	}
}

// TestHetznerRefusalsReachTheProxysCondition: a token Hetzner does not know
// fails the Proxy Permanent with its words in the Provisioned condition and
// creates nothing; a project at its server limit keeps a Proxy waiting on
// quota, not Failed, with its words too.
func TestHetznerRefusalsReachTheProxysCondition(t *testing.T) {
	prov, api, token := newHetzner(t)
	writeTestFile(t, token, "revoked-token")
	h := start(t, setup{providers: map[string]providers.Provider{"hetzner-fsn": prov}})
	h.create(gen.Proxy("bad-token", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("hetzner-fsn")))
	h.waitProxy("bad-token", "Failed with Hetzner's message", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseFailed && reason(p) == v1alpha1.ReasonPermanentError &&
			strings.Contains(message(p), "unable to authenticate (unauthorized")
	})
	if n := api.CallCount(hcloudapi.CreateServer); n != 0 || len(api.Servers()) != 0 {
		t.Fatalf("creates %d, servers %d: a refused token must create nothing", n, len(api.Servers()))
	}
	if strings.Contains(h.logs.dump(), "revoked-token") {
		t.Fatal("the controller logged the token")
	}

	writeTestFile(t, token, hcloudapi.DefaultToken)
	api.SetServerLimit(1)
	api.Put(hcloudapi.Server{Name: "web-1"})
	h.create(gen.Proxy("at-limit", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("hetzner-fsn")))
	p := h.waitProxy("at-limit", "waiting on quota with Hetzner's message", func(p *v1alpha1.Proxy) bool {
		return reason(p) == v1alpha1.ReasonQuotaExceeded && strings.Contains(message(p), "server limit exceeded (resource_limit_exceeded")
	})
	if p.Status.Phase == v1alpha1.PhaseFailed {
		t.Fatalf("a Proxy at the server limit is Failed: %s", describe(p))
	}
}
