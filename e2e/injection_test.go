package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http/httpproxy"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/inject"
	"github.com/proxyfleet/proxyfleet/controller/leases"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// TestInjectedSidecarLeasesWithItsPodsToken is the whole integration a
// crawler sees: the real controller binary serves the webhook (self-managed
// certificates, caBundle patched) and the lease API with token review; a
// labelled pod created on the real API server comes back with the sidecar;
// and that sidecar's command, run by the kubelet stand-in below with the
// pod's own token, leases from the controller so the app container's
// HTTPS_PROXY reaches the target through the fleet's Squid. The fleet's
// Proxy is in the controller's namespace, the crawler in its own: it runs
// both ways an installation from before ProxyGrants keeps its crawlers
// working (docs/tenancy.md, "Upgrading"): the fleet's owner shares it with
// a grant, or the controller runs --lease-api-tenancy cluster-wide.
func TestInjectedSidecarLeasesWithItsPodsToken(t *testing.T) {
	for _, path := range []string{"shared by a ProxyGrant", "cluster-wide tenancy without a grant"} {
		t.Run(path, func(t *testing.T) { testInjectedSidecar(t, path == "shared by a ProxyGrant") })
	}
}

func testInjectedSidecar(t *testing.T, grant bool) {
	bin := testutil.BuildBinary(t)
	sidecarBin := testutil.BuildSidecarBinary(t)
	env := testenv.Start(t)
	ctx := context.Background()
	ctlNS, crawlNS := env.Namespace(t), env.Namespace(t)
	configName := "proxyfleet-inject-" + ctlNS

	kubeconfig := env.WriteKubeconfig(t)
	tenancy := leases.TenancyNamespaced
	if !grant {
		tenancy = leases.TenancyClusterWide
	}
	_, addrs := testutil.StartProcessOnFreePorts(t, bin, 4, func(addrs []string) testutil.ProcessOptions {
		return testutil.ProcessOptions{
			Name: "controller[" + t.Name() + "]",
			Args: []string{"controller", "--kubeconfig", kubeconfig, "--proxy-namespace", ctlNS,
				"--metrics-listen", addrs[0], "--health-probe-listen", addrs[1], "--lease-api-listen", addrs[2],
				"--webhook-listen", addrs[3], "--status-listen", "0", "--gateway-image", "proxyfleet-sidecar:e2e",
				"--webhook-configuration", configName, "--webhook-cert-hosts", "127.0.0.1",
				"--sidecar-lease-api", "http://" + addrs[2], "--lease-api-token-review",
				"--health-tick", "100ms", "--log-format", "text", "--lease-api-tenancy", tenancy},
			Env:             []string{"POD_NAMESPACE=" + ctlNS},
			WaitAddrs:       addrs,
			ExpectCleanExit: true,
		}
	})
	leaseAPI, webhookAddr := addrs[2], addrs[3]

	// The chart's MutatingWebhookConfiguration, pointed at the controller's
	// loopback listener (this API server reaches no Services) and with no
	// caBundle: the controller must fill it in before any pod is admitted.
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: configName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "pod.inject.proxyfleet.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + webhookAddr + inject.Path)},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{inject.LabelInject: "true"}},
		}},
	}
	if err := env.Client.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), mwc) })

	// The fleet: one Squid behind an External Proxy.
	squids := startSquids(t, "inject", "127.0.0.121")
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	px := gen.Proxy("squid", gen.SetProxyNamespace(ctlNS), gen.SetProxyEndpoint("127.0.0.1", int32(squids[0].Port())),
		gen.SetProxyAttributes(map[string]string{"region": "eu"}),
		gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1}))
	if err := env.Client.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	waitProxy(t, env.Client, ctlNS, "squid", "Ready and Healthy", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseReady && meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHealthy)
	})

	// RBAC decides who leases: the crawler's service account is bound to
	// the chart's proxyfleet-lease-user in its namespace.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "crawler", Namespace: crawlNS}}))
	must(env.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: leases.LeaseUserClusterRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{leases.LeaseGroup}, Resources: []string{leases.LeaseResource}, Verbs: []string{leases.LeaseVerb}}}}))
	must(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "crawler-leases", Namespace: crawlNS},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: leases.LeaseUserClusterRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "crawler", Namespace: crawlNS}}}))
	// The fleet's Proxies are the controller namespace's: its owner shares
	// them with the crawler's namespace (docs/tenancy.md), unless tenancy
	// is cluster-wide.
	if grant {
		must(env.Client.Create(ctx, &v1alpha1.ProxyGrant{ObjectMeta: metav1.ObjectMeta{Name: "crawlers", Namespace: ctlNS},
			Spec: v1alpha1.ProxyGrantSpec{To: []v1alpha1.GrantSubject{{Namespace: crawlNS}}}}))
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "crawler", Namespace: crawlNS,
			Labels:      map[string]string{inject.LabelInject: "true"},
			Annotations: map[string]string{inject.AnnotationSelector: "region=eu"}},
		Spec: corev1.PodSpec{ServiceAccountName: "crawler", Containers: []corev1.Container{{Name: "crawler", Image: "crawler:1"}}},
	}
	// Admission fails (Fail policy) until the controller has patched the caBundle.
	poll.Until(t, pollTimeout, "the labelled pod admitted through the webhook", func() error {
		p := pod.DeepCopy()
		if err := env.Client.Create(ctx, p); err != nil {
			return err
		}
		pod = p
		return nil
	})
	if !inject.Injected(pod) {
		t.Fatalf("the admitted pod has no sidecar: %+v", pod.Spec)
	}

	sc := runSidecarAsKubeletStandIn(t, env, sidecarBin, pod)
	app := pod.Spec.Containers[0]
	proxyFor, httpsProxy := proxyFuncFromEnv(t, app, sc.listen)
	target := testutil.StartTLSTarget(t, testutil.TargetOptions{Host: "127.0.0.122"})
	// Go's (and curl's) clients never proxy a loopback target, and every
	// target here is loopback; so the app's client takes HTTPS_PROXY as it
	// would for a real site, once NO_PROXY is known not to exempt it.
	if noProxy, _ := envValue(app, "NO_PROXY"); slices.Contains(strings.Split(noProxy, ","), "127.0.0.122") {
		t.Fatalf("NO_PROXY %q exempts the target", noProxy)
	}
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(httpsProxy), TLSClientConfig: target.ClientTLSConfig(), DisableKeepAlives: true}}
	mustGetOK(t, c, target.URL()+"/through-the-sidecar", nil)
	if got := target.Sources(); !slices.Equal(got, outgoingAddrs(squids)) {
		t.Fatalf("target saw %v, want the fleet's Squid %v (the sidecar leased from %s)", got, outgoingAddrs(squids), leaseAPI)
	}
	for _, host := range []string{"api.crawl.svc:443", "db.crawl.svc.cluster.local:5432", "kubernetes.default:443"} {
		if u, _ := proxyFor(&url.URL{Scheme: "https", Host: host}); u != nil {
			t.Errorf("%s goes through the proxy %v; NO_PROXY must keep cluster traffic direct", host, u)
		}
	}
	if u, _ := proxyFor(&url.URL{Scheme: "https", Host: "example.com"}); u == nil || u.Host != sc.listen {
		t.Errorf("https://example.com is proxied via %v, want the sidecar %s", u, sc.listen)
	}
	if code, _, err := httpGet("http://" + sc.probe + "/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("the sidecar's readiness probe path answers %d %v", code, err)
	}
}

// standInSidecar is the sidecar as the kubelet stand-in runs it.
type standInSidecar struct {
	listen, probe string
}

// runSidecarAsKubeletStandIn is the KUBELET STAND-IN (envtest has no
// kubelet): it runs the injected sidecar container's own args with the real
// sidecar binary, doing what a kubelet would — it requests the projected
// service-account token the volume asks for (audience, expiry, bound to the
// pod) and writes it where the mount points, and it gives the container a
// network of its own by moving the loopback and probe ports to free ones (a
// pod has its own loopback; this test shares one); bin is the image's
// entrypoint, and a sidecar whose command is inject.MITMCommand runs the
// build with mirroring instead. It adds
// --allow-private-targets only because every target here is loopback.
func runSidecarAsKubeletStandIn(t *testing.T, env *testenv.Env, bin string, pod *corev1.Pod) standInSidecar {
	t.Helper()
	var sc corev1.Container
	for _, c := range pod.Spec.InitContainers {
		if c.Name == inject.SidecarName {
			sc = c
		}
	}
	switch {
	case len(sc.Command) == 0: // the image's entrypoint: the lean build, bin
	case slices.Equal(sc.Command, []string{inject.MITMCommand}):
		bin = testutil.BuildSidecarMITMBinary(t)
	default:
		t.Fatalf("kubelet stand-in: the sidecar's command %q is no binary of the sidecar image", sc.Command)
	}
	root := t.TempDir()
	mounts := map[string]string{}
	for _, m := range sc.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name != m.Name || v.Projected == nil {
				continue
			}
			dir := filepath.Join(root, v.Name)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, src := range v.Projected.Sources {
				p := src.ServiceAccountToken
				if p == nil {
					continue
				}
				tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
					Audiences: []string{p.Audience}, ExpirationSeconds: p.ExpirationSeconds,
					BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
				}}
				sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: pod.Spec.ServiceAccountName, Namespace: pod.Namespace}}
				if err := env.Client.SubResource("token").Create(context.Background(), sa, tr); err != nil {
					t.Fatalf("kubelet stand-in: TokenRequest for %s: %v", pod.Spec.ServiceAccountName, err)
				}
				writeFile(t, filepath.Join(dir, p.Path), tr.Status.Token)
			}
			mounts[m.MountPath] = dir
		}
	}
	var out standInSidecar
	// The pod's ports are the host's here: each listener moves to a free one
	// (the stand-in waits for all three, the status page's included).
	_, addrs := testutil.StartProcessOnFreePorts(t, bin, 3, func(addrs []string) testutil.ProcessOptions {
		args := make([]string, 0, len(sc.Args)+1)
		for _, a := range sc.Args {
			for mp, dir := range mounts {
				a = strings.ReplaceAll(a, mp, dir)
			}
			a = strings.Replace(a, "--listen="+inject.ProxyAddr, "--listen="+addrs[0], 1)
			a = strings.Replace(a, fmt.Sprintf("--metrics-listen=:%d", inject.ProbePort), "--metrics-listen="+addrs[1], 1)
			a = strings.Replace(a, "--status-listen="+inject.StatusAddr, "--status-listen="+addrs[2], 1)
			args = append(args, a)
		}
		args = append(args, "--allow-private-targets")
		return testutil.ProcessOptions{Name: "sidecar[" + t.Name() + "]", Args: args, WaitAddrs: addrs, ExpectCleanExit: true}
	})
	out.listen, out.probe = addrs[0], addrs[1]
	for _, a := range sc.Args {
		if strings.Contains(a, inject.ProxyAddr) && !strings.HasPrefix(a, "--listen=") {
			t.Fatalf("kubelet stand-in: unexpected use of %s in %q", inject.ProxyAddr, a)
		}
	}
	return out
}

// proxyFuncFromEnv is how the app container's HTTP clients pick a proxy
// from the env the webhook gave it (Go's rules; curl's and Python's agree
// on these values), with the sidecar's loopback port moved as the stand-in
// moved it.
func proxyFuncFromEnv(t *testing.T, c corev1.Container, listen string) (func(*url.URL) (*url.URL, error), *url.URL) {
	t.Helper()
	get := func(name string) string {
		v, ok := envValue(c, name)
		if !ok {
			t.Fatalf("app container has no %s: %v", name, c.Env)
		}
		return strings.Replace(v, inject.ProxyAddr, listen, 1)
	}
	cfg := httpproxy.Config{HTTPProxy: get("HTTP_PROXY"), HTTPSProxy: get("HTTPS_PROXY"), NoProxy: get("NO_PROXY")}
	u, err := url.Parse(cfg.HTTPSProxy)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.ProxyFunc(), u
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}
