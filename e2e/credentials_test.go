package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
)

// TestExternalProxyWithALoginServesAPoolAPIGateway runs the real controller
// and a real gateway in --lease-api mode in front of a real Squid that
// demands basic auth (as a commercial upstream or a VM's bootstrap Squid
// does). The External Proxy names its login by credentialsSecretRef: the
// health engine must log in for it to turn Ready, and the gateway gets the
// login only with its lease, so every request through it - plain HTTP and
// CONNECT - reaches the site only if the login travels upstream.
func TestExternalProxyWithALoginServesAPoolAPIGateway(t *testing.T) {
	bin := testutil.BuildBinary(t)
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx := context.Background()

	const user, password = "crawler", "Upstream-pa55/word"
	sq := squid.Start(t, squid.Options{Name: "vendor-auth", OutgoingAddr: "127.0.0.65",
		BasicAuth: &squid.Login{Username: user, Password: password}})
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	site := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	tlsSite := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})

	const apiToken = "e2e-credentials-token"
	tokenFile := filepath.Join(t.TempDir(), "lease-api-token")
	writeFile(t, tokenFile, apiToken+"\n")
	ctl := startController(t, bin, env, ns, "--lease-api-token-file", tokenFile, "--health-tick", "100ms")

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vendor-login",
			Labels: map[string]string{v1alpha1.LabelCredentials: v1alpha1.ValueTrue}},
		Type:       corev1.SecretTypeBasicAuth,
		StringData: map[string]string{"username": user, "password": password},
	}
	if err := env.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	px := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vendor"},
		Spec: v1alpha1.ProxySpec{
			Mode: v1alpha1.ModeExternal,
			Endpoint: &v1alpha1.Endpoint{Host: "127.0.0.1", Port: int32(sq.Port()), Scheme: v1alpha1.SchemeHTTP,
				CredentialsSecretRef: &v1alpha1.SecretRef{Name: "vendor-login"}},
			HealthCheck: v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1},
		},
	}
	if err := env.Client.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	waitProxy(t, env.Client, ns, "vendor", "Ready: probed with its login", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseReady && meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHealthy)
	})
	if probe.Count("127.0.0.65") == 0 {
		t.Fatal("Ready, but no probe went through the authenticating Squid")
	}

	api, err := leaseapi.NewClient("http://"+ctl.leaseAPIAddr, apiToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The lease API reads the Proxies from the controller's cache, which
	// may see the Ready status a moment after this test's client did.
	var listed []leaseapi.ProxyInfo
	poll.Until(t, 30*time.Second, "the one Proxy offered by the lease API", func() error {
		var err error
		if listed, err = api.List(ctx, leaseapi.ListFilter{HealthyOnly: true}); err != nil || len(listed) != 1 {
			return fmt.Errorf("healthy members %+v (%v), want the one Proxy", listed, err)
		}
		return nil
	})
	if want := "http://" + user + ":xxxxx@" + sq.Addr(); listed[0].URL != want {
		t.Fatalf("GET /v1/proxies lists %s, want %s (the password masked)", listed[0].URL, want)
	}

	poolToken := filepath.Join(t.TempDir(), "pool-token")
	writeFile(t, poolToken, apiToken+"\n")
	gw := startGateway(t, bin, gwConfig{args: []string{"--lease-api", "http://" + ctl.leaseAPIAddr, "--pool-token-file", poolToken}})

	r := mustGetOK(t, gw.client(t, "", nil), site.URL()+"/through-the-vendor", nil)
	if r.source != "127.0.0.65" || r.proxy != ns+"/vendor" {
		t.Fatalf("plain HTTP reached the site from %s via %q, want 127.0.0.65 via %s/vendor", r.source, r.proxy, ns)
	}
	r = mustGetOK(t, gw.tunnelClient(t, "", tlsSite.ClientTLSConfig()), tlsSite.URL()+"/tunnelled", nil)
	if r.source != "127.0.0.65" {
		t.Fatalf("CONNECT reached the site from %s, want 127.0.0.65 (the authenticating Squid)", r.source)
	}
	for name, out := range map[string]string{"controller": ctl.Output(), "gateway": gw.Output()} {
		if strings.Contains(out, password) || strings.Contains(out, strings.ReplaceAll(password, "/", "%2F")) {
			t.Errorf("the %s logged the upstream password:\n%s", name, grepLines(out, "pa55"))
		}
	}
}
