package controller

import (
	"context"
	"strings"
	"testing"

	compute "cloud.google.com/go/compute/apiv1"
	"google.golang.org/api/option"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/internal/testkit/computeapi"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
	gcpprovider "github.com/proxyfleet/proxyfleet/providers/gcp"
)

const gcpZone = "europe-west1-b"

// startGCP runs the real controller with the real gcp provider on the real
// compute REST client, pointed at an in-test Compute API.
func startGCP(t *testing.T, engine *health.Options) (*harness, *computeapi.Server) {
	t.Helper()
	srv := computeapi.Start(t, "proxy-project")
	c, err := compute.NewInstancesRESTClient(context.Background(), option.WithEndpoint(srv.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	prov, err := gcpprovider.New(c, gcpprovider.Config{
		Project:  "proxy-project",
		Defaults: providers.Placement{Zone: gcpZone, MachineType: "e2-micro", Image: "projects/debian-cloud/global/images/family/debian-12"},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, setup{providers: map[string]providers.Provider{"gcp-eu": providers.WithMetrics(prov, "gcp-eu", nopRecorder{})}, engine: engine})
	return h, srv
}

type nopRecorder struct{}

func (nopRecorder) ProviderRequest(string, string, string) {}

// TestGCPManagedProxyBootsWithItsOwnLoginAndCleansUp runs a Managed Proxy
// on the real gcp provider, the real reconciler and the real health engine.
// Compute Engine is the in-test API; the VM's Squid is a real Squid on
// 127.0.0.1 standing in for it ("vm-squid-stand-in"), running with the
// htpasswd file the VM's bootstrap carries, so the probes reach Ready only
// if they log in with the generated Secret's login.
func TestGCPManagedProxyBootsWithItsOwnLoginAndCleansUp(t *testing.T) {
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	// Started first for its port (the Proxy names it); its login is set
	// below, once the controller has generated one.
	vmSquid := squid.Start(t, squid.Options{Name: "vm-squid-stand-in", OutgoingAddr: "127.0.0.44",
		BasicAuth: &squid.Login{Username: "placeholder", Password: "placeholder-" + squid.ServiceName()}})
	h, srv := startGCP(t, &health.Options{})
	px := gen.Proxy("eu-1", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("gcp-eu"), gen.SetProxyPort(int32(vmSquid.Port())),
		gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: target.URL() + "/health", IntervalSeconds: 2, TimeoutSeconds: 2}))
	h.create(px)
	p := h.waitProxy("eu-1", "instance inserted", func(p *v1alpha1.Proxy) bool { return p.Status.ProviderID != "" })
	name := providers.NameFromUID(string(p.UID))
	if want := "zones/" + gcpZone + "/instances/" + name; p.Status.ProviderID != want {
		t.Fatalf("providerID = %s, want %s", p.Status.ProviderID, want)
	}

	// The login Secret: generated, owned by the Proxy, labelled.
	var s corev1.Secret
	key := types.NamespacedName{Namespace: h.ns, Name: credentials.GeneratedSecretName(p)}
	if err := env.Client.Get(h.ctx(), key, &s); err != nil {
		t.Fatalf("credentials Secret: %v", err)
	}
	if !metav1.IsControlledBy(&s, p) || s.Labels[v1alpha1.LabelCredentials] != v1alpha1.ValueTrue || s.Type != corev1.SecretTypeBasicAuth {
		t.Fatalf("credentials Secret %+v: want owned by the Proxy, labelled, basic-auth", s.ObjectMeta)
	}
	user, pass := string(s.Data["username"]), string(s.Data["password"])
	if user == "" || len(pass) < 32 {
		t.Fatalf("generated login %q/%d chars: want a user and a long random password", user, len(pass))
	}

	// The VM boots proxyfleet's bootstrap, whose Squid demands that login.
	inst := srv.Instance(gcpZone, name)
	ud := inst["metadata"].(map[string]any)["items"].([]any)[0].(map[string]any)["value"].(string)
	var cc struct {
		WriteFiles []struct{ Path, Content string } `json:"write_files"`
	}
	if err := yaml.Unmarshal([]byte(ud), &cc); err != nil {
		t.Fatal(err)
	}
	var htpasswd string
	for _, f := range cc.WriteFiles {
		if f.Path == bootstrap.PasswordFilePath {
			htpasswd = f.Content
		}
	}
	if u, _, _ := strings.Cut(htpasswd, ":"); u != user || strings.Contains(ud, pass) {
		t.Fatalf("the VM's password file is for user %q, want %q (or the user-data leaks the password)", u, user)
	}

	// The VM's Squid, stood in for on 127.0.0.1, runs with the bootstrap's
	// own password file; its start-up self-probe logs in with the Secret's
	// login, so it starts only if real Squid accepts that file.
	vmSquid.Stop()
	vmSquid.SetBasicAuth(&squid.Login{Username: user, Password: pass, Htpasswd: htpasswd})
	vmSquid.Start()

	// Compute Engine brings it up; the reconciler adopts the NAT IP and the
	// health engine, logging in with the Secret, turns it Ready.
	srv.SetStatus(gcpZone, name, "RUNNING")
	srv.SetAddresses(gcpZone, name, "10.132.0.5", "127.0.0.1")
	h.waitProxy("eu-1", "Ready at the NAT IP, probed through the VM's Squid with its login", func(p *v1alpha1.Proxy) bool {
		return p.Status.IP == "127.0.0.1" && reason(p) == v1alpha1.ReasonCreated &&
			p.Status.Phase == v1alpha1.PhaseReady && p.IsHealthy()
	})
	if target.Count("127.0.0.44") == 0 {
		t.Fatal("Ready, but the probe target never saw a request from the VM Squid's outgoing address")
	}
	if strings.Contains(h.logs.dump(), pass) {
		t.Fatal("the controller logged the proxy password")
	}
	// One VM: a second insert may happen when a reconcile read the Proxy
	// from a cache that did not have its providerID yet; Compute answers it
	// 409 alreadyExists and the provider adopts the instance, so it never
	// makes a second VM.
	if got := srv.Instances(); len(got) != 1 {
		t.Fatalf("instances %v, want one (the reconciler must not make a second VM)", got)
	}
	if n := srv.CallCount("POST "); n < 1 || n > 2 {
		t.Fatalf("inserts = %d, want 1 (or 2 with the second answered alreadyExists)", n)
	}

	// Deleting the Proxy deletes the VM and the login.
	if err := env.Client.Delete(h.ctx(), p); err != nil {
		t.Fatal(err)
	}
	h.waitGone("eu-1")
	if n := srv.CallCount("DELETE /compute/v1/projects/proxy-project/zones/" + gcpZone + "/instances/" + name); n < 1 {
		t.Fatalf("Delete never reached the API: %v", srv.Calls())
	}
	if got := srv.Instances(); len(got) != 0 {
		t.Fatalf("instances left: %v", got)
	}
	if err := env.Client.Get(h.ctx(), key, &s); !apierrors.IsNotFound(err) {
		t.Fatalf("credentials Secret after the Proxy is gone: err = %v, want NotFound", err)
	}
}

func TestGCPManagedProxyWithOwnCloudInitGetsNoGeneratedLogin(t *testing.T) {
	h, srv := startGCP(t, nil)
	px := gen.Proxy("own", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("gcp-eu"),
		gen.SetProxyCloudInit("#cloud-config\nruncmd: [[echo, mine]]\n"))
	h.create(px)
	p := h.waitProxy("own", "instance inserted", func(p *v1alpha1.Proxy) bool { return p.Status.ProviderID != "" })
	ud := srv.Instance(gcpZone, providers.NameFromUID(string(p.UID)))["metadata"].(map[string]any)["items"].([]any)[0].(map[string]any)["value"]
	if ud != px.Spec.CloudInit.Inline {
		t.Fatalf("user-data = %q, want the Proxy's own cloud-init", ud)
	}
	var s corev1.Secret
	err := env.Client.Get(h.ctx(), types.NamespacedName{Namespace: h.ns, Name: credentials.GeneratedSecretName(p)}, &s)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("a Proxy with its own cloud-init got a generated login Secret (err %v)", err)
	}
}
