package controller

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
	"github.com/proxyfleet/proxyfleet/internal/testkit/libvirtd"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
	kvmprovider "github.com/proxyfleet/proxyfleet/providers/kvm"
	"github.com/proxyfleet/proxyfleet/providers/nocloud"
)

// TestKVMManagedProxyGetsARunningDomainAndDeletesItCleanly runs a Managed
// Proxy on a kvm entry — parsed from a providers config file and built by
// the registry, as the binary does — through the real reconciler, against a
// real libvirtd reached over a real sshd. The test image boots no OS, so
// the guest never reports an address and the Proxy stays Provisioning: the
// test stops there (no Squid readiness is stood in for). It checks the
// domain is defined and running with the generated login in its seed, and
// that deleting the Proxy destroys and undefines the domain and removes its
// volumes and the login Secret.
func TestKVMManagedProxyGetsARunningDomainAndDeletesItCleanly(t *testing.T) {
	host := libvirtd.StartKVMHost(t)
	lvd := host.Libvirtd
	cfg, err := providers.ParseConfig([]byte(host.Config), map[string]providers.Decoder{kvmprovider.Type: providers.DecoderOf(kvmprovider.ReadConfig)})
	if err != nil {
		t.Fatalf("providers config: %v\n%s", err, host.Config)
	}
	built, err := providers.NewRegistry(map[string]providers.Constructor{kvmprovider.Type: kvmprovider.Constructor(logr.Discard())}).Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(built["kvm-local"].(*kvmprovider.Provider).Close)
	h := start(t, setup{providers: map[string]providers.Provider{"kvm-local": providers.WithMetrics(built["kvm-local"], "kvm-local", nopRecorder{})}})

	px := gen.Proxy("home-1", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("kvm-local"), gen.SetProxyPort(3128))
	h.create(px)
	p := h.waitProxy("home-1", "domain defined and started", func(p *v1alpha1.Proxy) bool {
		return p.Status.ProviderID != "" && p.Status.Phase == v1alpha1.PhaseProvisioning
	})
	name := providers.NameFromUID(string(p.UID))
	if want := kvmprovider.FormatProviderID("local", name); p.Status.ProviderID != want {
		t.Fatalf("providerID = %s, want %s", p.Status.ProviderID, want)
	}
	lv := lvd.Connect(t)
	defer func() { _ = lv.Disconnect() }()
	lvd.RequireRunning(t, lv, name)

	// The seed boots the shared bootstrap whose Squid demands the login the
	// controller generated and keeps in the Proxy's Secret.
	var s corev1.Secret
	key := types.NamespacedName{Namespace: h.ns, Name: credentials.GeneratedSecretName(p)}
	if err := env.Client.Get(h.ctx(), key, &s); err != nil {
		t.Fatalf("credentials Secret: %v", err)
	}
	iso, err := os.ReadFile(filepath.Join(lvd.PoolDir, name+"-seed.iso"))
	if err != nil {
		t.Fatal(err)
	}
	_, files, err := nocloud.ReadISO(iso)
	if err != nil {
		t.Fatal(err)
	}
	var cc struct {
		WriteFiles []struct{ Path, Content string } `json:"write_files"`
	}
	if err := yaml.Unmarshal(files["user-data"], &cc); err != nil {
		t.Fatal(err)
	}
	var htpasswd string
	for _, f := range cc.WriteFiles {
		if f.Path == bootstrap.PasswordFilePath {
			htpasswd = f.Content
		}
	}
	if u, _, _ := strings.Cut(htpasswd, ":"); u == "" || u != string(s.Data["username"]) || strings.Contains(string(files["user-data"]), string(s.Data["password"])) {
		t.Fatalf("the seed's password file is for %q, want the Secret's user %q (and never the password in clear)", u, s.Data["username"])
	}
	if strings.Contains(h.logs.dump(), string(s.Data["password"])) {
		t.Fatal("the controller logged the proxy password")
	}

	// Deleting the Proxy destroys and undefines the domain and removes its
	// volumes; the cached base image and its marker stay for the next guest.
	if err := env.Client.Delete(h.ctx(), p); err != nil {
		t.Fatal(err)
	}
	h.waitGone("home-1")
	if _, err := lv.DomainLookupByName(name); err == nil {
		t.Fatal("the domain is still defined after the Proxy is gone")
	}
	if files := lvd.PoolFiles(t); !slices.Equal(files, host.CachedBaseFiles) {
		t.Fatalf("pool after delete = %v, want only the cached base and its marker", files)
	}
	if err := env.Client.Get(h.ctx(), key, &s); !apierrors.IsNotFound(err) {
		t.Fatalf("credentials Secret after the Proxy is gone: err = %v, want NotFound", err)
	}
}
