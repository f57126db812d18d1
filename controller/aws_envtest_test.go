package controller

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/internal/testkit/ec2api"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/providers"
	awsprovider "github.com/proxyfleet/proxyfleet/providers/aws"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
)

const awsRegion = "eu-west-1"

// newAWS is the real aws provider on the real EC2 client, pointed at an
// in-test EC2 API and signing with a static key from files, as a mounted
// Secret holds it.
func newAWS(t *testing.T) (*awsprovider.Provider, *ec2api.Server) {
	t.Helper()
	p, srv, _ := newAWSWithKey(t)
	return p, srv
}

// newAWSWithKey is newAWS, also returning the key files.
func newAWSWithKey(t *testing.T) (*awsprovider.Provider, *ec2api.Server, *awsprovider.Credentials) {
	t.Helper()
	srv := ec2api.Start(t, awsRegion)
	dir := t.TempDir()
	creds := &awsprovider.Credentials{AccessKeyIDFile: filepath.Join(dir, "access-key-id"), SecretAccessKeyFile: filepath.Join(dir, "secret-access-key")}
	for f, v := range map[string]string{creds.AccessKeyIDFile: ec2api.DefaultAccessKeyID, creds.SecretAccessKeyFile: ec2api.DefaultSecretAccessKey} {
		if err := os.WriteFile(f, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	prov, err := awsprovider.New(context.Background(), awsprovider.Config{
		Region: awsRegion, Entry: "aws-eu",
		Defaults:     providers.Placement{Zone: awsRegion + "b", MachineType: "t3.micro"},
		SourceRanges: []string{"127.0.0.0/8"},
		Endpoint:     srv.URL, Credentials: creds,
	})
	if err != nil {
		t.Fatal(err)
	}
	return prov, srv, creds
}

// TestAWSManagedProxyBootsWithItsOwnLoginAndCleansUp runs a Managed Proxy
// on the real aws provider, the real reconciler and the real health
// engine. EC2 is the in-test API; the instance's Squid is a real Squid on
// 127.0.0.1 standing in for it ("ec2-squid-stand-in"), running with the
// htpasswd file the instance's user-data carries, so the probes reach
// Ready only if they log in with the generated Secret's login.
func TestAWSManagedProxyBootsWithItsOwnLoginAndCleansUp(t *testing.T) {
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	vmSquid := squid.Start(t, squid.Options{Name: "ec2-squid-stand-in", OutgoingAddr: "127.0.0.45",
		BasicAuth: &squid.Login{Username: "placeholder", Password: "placeholder-" + squid.ServiceName()}})
	prov, srv := newAWS(t)
	h := start(t, setup{providers: map[string]providers.Provider{"aws-eu": providers.WithMetrics(prov, "aws-eu", nopRecorder{})}, engine: &health.Options{}})
	px := gen.Proxy("eu-1", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("aws-eu"), gen.SetProxyPort(int32(vmSquid.Port())),
		gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: target.URL() + "/health", IntervalSeconds: 2, TimeoutSeconds: 2}))
	h.create(px)
	p := h.waitProxy("eu-1", "instance launched", func(p *v1alpha1.Proxy) bool { return p.Status.ProviderID != "" })
	live := srv.Live()
	if len(live) != 1 || p.Status.ProviderID != "aws:///"+awsRegion+"b/"+live[0].ID {
		t.Fatalf("providerID = %s, instances %+v: want the one instance", p.Status.ProviderID, live)
	}
	ins := live[0]
	if ins.ClientToken != string(p.UID) || ins.Tags[awsprovider.TagOwnerUID] != string(p.UID) || ins.Tags[awsprovider.TagInstallation] != testInstallation ||
		ins.Tags[awsprovider.TagName] != providers.NameFromUID(string(p.UID)) || ins.Tags[awsprovider.TagOwner] != h.ns+"/eu-1" {
		t.Fatalf("instance token %q, tags %v: want the Proxy's UID, installation and name", ins.ClientToken, ins.Tags)
	}

	// The login Secret, and the instance's user-data: the bootstrap whose
	// Squid demands that login.
	var s corev1.Secret
	key := types.NamespacedName{Namespace: h.ns, Name: credentials.GeneratedSecretName(p)}
	if err := env.Client.Get(h.ctx(), key, &s); err != nil {
		t.Fatalf("credentials Secret: %v", err)
	}
	user, pass := string(s.Data["username"]), string(s.Data["password"])
	var cc struct {
		WriteFiles []struct{ Path, Content string } `json:"write_files"`
	}
	if err := yaml.Unmarshal([]byte(ins.UserData), &cc); err != nil {
		t.Fatal(err)
	}
	var htpasswd string
	for _, f := range cc.WriteFiles {
		if f.Path == bootstrap.PasswordFilePath {
			htpasswd = f.Content
		}
	}
	if u, _, _ := strings.Cut(htpasswd, ":"); u != user || user == "" || strings.Contains(ins.UserData, pass) {
		t.Fatalf("the instance's password file is for user %q, want %q (or the user-data leaks the password)", u, user)
	}
	// The security group admits the Proxy's port from the source ranges.
	groups := srv.SecurityGroups()
	if len(groups) != 1 || len(groups[0].Ingress) != 1 || groups[0].Ingress[0].FromPort != vmSquid.Port() {
		t.Fatalf("security groups %+v: want one admitting port %d only", groups, vmSquid.Port())
	}

	vmSquid.Stop()
	vmSquid.SetBasicAuth(&squid.Login{Username: user, Password: pass, Htpasswd: htpasswd})
	vmSquid.Start()

	// EC2 brings the instance up; the reconciler adopts its public address
	// and the health engine, logging in with the Secret, turns it Ready.
	if got := h.mustGet("eu-1"); got.Status.Phase == v1alpha1.PhaseReady || got.Status.IP != "" {
		t.Fatalf("Proxy %s at %q while its instance is pending", got.Status.Phase, got.Status.IP)
	}
	srv.SetState(ins.ID, ec2api.StateRunning)
	srv.SetAddresses(ins.ID, "10.0.1.5", "127.0.0.1", "")
	h.waitProxy("eu-1", "Ready at the public address, probed through the instance's Squid with its login", func(p *v1alpha1.Proxy) bool {
		return p.Status.IP == "127.0.0.1" && p.Status.Phase == v1alpha1.PhaseReady && p.IsHealthy()
	})
	if target.Count("127.0.0.45") == 0 {
		t.Fatal("Ready, but the probe target never saw a request from the instance Squid's outgoing address")
	}
	if logs := h.logs.dump(); strings.Contains(logs, pass) || strings.Contains(logs, ec2api.DefaultSecretAccessKey) {
		t.Fatal("the controller logged the proxy password or the AWS secret key")
	}
	if n := len(srv.Instances()); n != 1 {
		t.Fatalf("instances = %d, want 1 (a repeated launch answers the same client token)", n)
	}

	// Deleting the Proxy terminates the instance and deletes the login.
	if err := env.Client.Delete(h.ctx(), p); err != nil {
		t.Fatal(err)
	}
	h.waitGone("eu-1")
	if live := srv.Live(); len(live) != 0 {
		t.Fatalf("instances left running: %+v", live)
	}
	if err := env.Client.Get(h.ctx(), key, &s); !apierrors.IsNotFound(err) {
		t.Fatalf("credentials Secret after the Proxy is gone: err = %v, want NotFound", err)
	}
}

// TestAWSProxyPoolScalesItsInstances: a ProxyPool of three on the aws
// provider has three instances; scaled to five it has five; scaled back,
// three, the other two terminated.
func TestAWSProxyPoolScalesItsInstances(t *testing.T) {
	prov, srv := newAWS(t)
	srv.LaunchRunning("127.0.0.1")
	ph := startPool(t, poolSetup{providers: map[string]providers.Provider{"aws-eu": prov}})
	pool := gen.ProxyPool("eu", gen.SetProxyPoolNamespace(ph.ns), gen.SetProxyPoolReplicas(3),
		gen.SetProxyPoolTemplate(gen.Proxy("unused", gen.SetProxyManaged("aws-eu")).Spec))
	ph.create(pool)
	running := func(n int) func(*v1alpha1.ProxyPool, []v1alpha1.Proxy) bool {
		return func(p *v1alpha1.ProxyPool, ps []v1alpha1.Proxy) bool {
			return settled(n)(p, ps) && len(srv.Live()) == n
		}
	}
	for _, n := range []int32{3, 5, 3} {
		if n != 3 || len(srv.Instances()) > 0 {
			ph.scaleTo("eu", n)
		}
		_, ps := ph.waitPool("eu", "instances follow the pool", running(int(n)))
		byUID := map[string]bool{}
		for _, in := range srv.Live() {
			byUID[in.Tags[awsprovider.TagOwnerUID]] = true
		}
		for _, px := range ps {
			if !byUID[string(px.UID)] {
				t.Fatalf("at %d replicas Proxy %s has no live instance (instances %+v)", n, px.Name, srv.Live())
			}
		}
	}
	if n := len(srv.Instances()); n != 5 {
		t.Fatalf("instances ever launched = %d, want 5", n)
	}
}

// TestAWSRefusalsReachTheProxysCondition: a key EC2 does not know fails
// the Proxy Permanent with EC2's own words in its Provisioned condition
// and launches nothing; an account at its instance limit keeps a Proxy
// waiting on quota, not Failed, with EC2's words too.
func TestAWSRefusalsReachTheProxysCondition(t *testing.T) {
	prov, srv, creds := newAWSWithKey(t)
	if err := os.WriteFile(creds.AccessKeyIDFile, []byte("AKIDUNKNOWN000000000"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := start(t, setup{providers: map[string]providers.Provider{"aws-eu": prov}})
	h.create(gen.Proxy("bad-key", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("aws-eu")))
	h.waitProxy("bad-key", "Failed with EC2's message", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseFailed && reason(p) == v1alpha1.ReasonPermanentError &&
			strings.Contains(message(p), "AuthFailure") && strings.Contains(message(p), "AWS was not able to validate the provided access credentials")
	})
	if n := srv.CallCount(ec2api.RunInstances); n != 0 || len(srv.Instances()) != 0 {
		t.Fatalf("RunInstances calls %d, instances %d: a refused key must launch nothing", n, len(srv.Instances()))
	}
	if strings.Contains(h.logs.dump(), ec2api.DefaultSecretAccessKey) {
		t.Fatal("the controller logged the secret key")
	}

	if err := os.WriteFile(creds.AccessKeyIDFile, []byte(ec2api.DefaultAccessKeyID), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.Fail(ec2api.RunInstances, ec2api.Error{Status: 400, Code: "InstanceLimitExceeded", Message: "You have requested more instances (21) than your current instance limit of 20 allows"})
	h.create(gen.Proxy("at-limit", gen.SetProxyNamespace(h.ns), gen.SetProxyManaged("aws-eu")))
	p := h.waitProxy("at-limit", "waiting on quota with EC2's message", func(p *v1alpha1.Proxy) bool {
		return reason(p) == v1alpha1.ReasonQuotaExceeded && strings.Contains(message(p), "current instance limit of 20")
	})
	if p.Status.Phase == v1alpha1.PhaseFailed {
		t.Fatalf("a Proxy at the instance limit is Failed: %s", describe(p))
	}
}
