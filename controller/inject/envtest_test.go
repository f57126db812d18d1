package inject_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/controller/inject"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// env is the package's one real API server (kube-apiserver + etcd).
var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

// wait is generous: a busy 2-core machine.
const wait = 60 * time.Second

// testConfig is the injection settings the tests run with.
func testConfig(skipNS string) inject.Config {
	return inject.Config{
		Image:          "proxyfleet/proxyfleet-sidecar:test",
		PoolAPI:        "http://proxyfleet.proxyfleet-system.svc:8090",
		ClusterDomain:  "cluster.local",
		APIServerHosts: []string{"10.96.0.1"},
		ClusterNoProxy: []string{"10.96.0.0/12", "10.244.0.0/16"},
		SkipNamespaces: []string{skipNS},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: mustQuantity("20m"), corev1.ResourceMemory: mustQuantity("24Mi")}},
	}
}

// webhookConfiguration is shaped like the chart's, pointed at url instead of
// the Service (the API server here cannot reach Services): one webhook for
// labelled pods, one for pods in labelled namespaces, both skipping the
// controller's namespace. Unlike the chart's, the namespace webhook here also
// sees pods labelled "true", so such a pod passes both webhooks: that pins
// that the second admission does not inject again.
func webhookConfiguration(name, url, controllerNS string, caBundle []byte) *admissionregistrationv1.MutatingWebhookConfiguration {
	notController := metav1.LabelSelectorRequirement{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{controllerNS}}
	hook := func(hookName string, obj, ns *metav1.LabelSelector) admissionregistrationv1.MutatingWebhook {
		return admissionregistrationv1.MutatingWebhook{
			Name:                    hookName,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url + inject.Path), CABundle: caBundle},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
			ObjectSelector:          obj,
			NamespaceSelector:       ns,
		}
	}
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			hook("pod.inject.proxyfleet.io",
				&metav1.LabelSelector{MatchLabels: map[string]string{inject.LabelInject: "true"}},
				&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{notController}}),
			hook("namespace.inject.proxyfleet.io",
				&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: inject.LabelInject, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"false"}}}},
				&metav1.LabelSelector{MatchLabels: map[string]string{inject.LabelInject: "true"}, MatchExpressions: []metav1.LabelSelectorRequirement{notController}}),
		},
	}
}

// staleCA is a CA nobody signs with: a caBundle the controller must replace.
func staleCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "stale"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// injection is a running webhook on the test API server.
type injection struct {
	ctx        context.Context
	secret     types.NamespacedName
	configName string
}

// startInjection runs the controller's webhook (self-managed certificates)
// on a free loopback port and registers it with the API server through a
// MutatingWebhookConfiguration whose caBundle starts stale: every pod test
// below therefore also proves the controller patched it.
func startInjection(t *testing.T, tune ...func(*inject.Config)) *injection {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	controllerNS := env.Namespace(t)
	mgr, err := controller.NewManager(env.Config, controller.ManagerOptions{MetricsAddr: "0", HealthProbeAddr: "0"})
	if err != nil {
		t.Fatal(err)
	}
	in := &injection{ctx: ctx, secret: types.NamespacedName{Namespace: controllerNS, Name: "proxyfleet-webhook-cert"},
		configName: "proxyfleet-inject-" + controllerNS}
	conf := testConfig(controllerNS)
	for _, f := range tune {
		f(&conf)
	}
	srv, err := inject.Setup(mgr, inject.Options{
		Listen: "127.0.0.1:0", Config: conf,
		CertSecret: in.secret, Configuration: in.configName, Hosts: []string{"127.0.0.1"},
		CertInterval: 200 * time.Millisecond, Log: (&testutil.LogLines{}).Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := webhookConfiguration(in.configName, "https://"+srv.Addr().String(), controllerNS, staleCA(t))
	if err := env.Client.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cfg) })
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	in.waitCABundle(t)
	return in
}

// waitCABundle waits until every webhook's caBundle is the Secret's CA.
func (in *injection) waitCABundle(t *testing.T) {
	t.Helper()
	poll.Until(t, wait, "every webhook's caBundle to be the Secret's CA", func() error {
		sec := &corev1.Secret{}
		if err := env.Client.Get(in.ctx, in.secret, sec); err != nil {
			return err
		}
		cfg := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := env.Client.Get(in.ctx, client.ObjectKey{Name: in.configName}, cfg); err != nil {
			return err
		}
		for _, w := range cfg.Webhooks {
			if string(w.ClientConfig.CABundle) != string(sec.Data[inject.SecretCACert]) || len(w.ClientConfig.CABundle) == 0 {
				return fmt.Errorf("webhook %s caBundle is not the Secret's CA yet", w.Name)
			}
		}
		return nil
	})
}

func crawlerPod(ns string, labels, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "crawler-", Namespace: ns, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "crawler", Image: "crawler:1", Env: []corev1.EnvVar{{Name: "KEEP", Value: "me"}}},
			{Name: "parser", Image: "parser:1"},
		}},
	}
}

// create creates pod through the API server (and so through the webhook),
// retrying while the API server has not yet seen a just-patched caBundle.
func (in *injection) create(t *testing.T, pod *corev1.Pod) (*corev1.Pod, error) {
	t.Helper()
	var err error
	deadline := time.Now().Add(wait)
	for {
		p := pod.DeepCopy()
		err = env.Client.Create(in.ctx, p)
		if err == nil {
			return p, nil
		}
		if !strings.Contains(err.Error(), "x509") && !strings.Contains(err.Error(), "connection refused") || time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func sidecars(p *corev1.Pod) []corev1.Container {
	var out []corev1.Container
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		if c.Name == inject.SidecarName {
			out = append(out, c)
		}
	}
	return out
}

func envOf(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// assertInjected checks the sidecar, its token and the app containers' env.
func assertInjected(t *testing.T, p *corev1.Pod) {
	t.Helper()
	sc := sidecars(p)
	if len(sc) != 1 {
		t.Fatalf("pod %s has %d sidecars, want 1", p.Name, len(sc))
	}
	if p.Spec.InitContainers[0].Name != inject.SidecarName {
		t.Errorf("sidecar is not the first init container: %v", p.Spec.InitContainers)
	}
	s := sc[0]
	if s.RestartPolicy == nil || *s.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("sidecar restartPolicy = %v, want Always (a native sidecar)", s.RestartPolicy)
	}
	if _, mitm := p.Annotations[inject.AnnotationMITM]; !mitm && len(s.Command) != 0 {
		t.Errorf("a pod without MITM has its sidecar run %q, want the image's entrypoint (the lean build)", s.Command)
	}
	for _, want := range []string{"gateway", "--listen=127.0.0.1:3128", "--lease-api=http://proxyfleet.proxyfleet-system.svc:8090", "--pool-sa-token-file=" + inject.TokenPath} {
		if !slices.Contains(s.Args, want) {
			t.Errorf("sidecar args %q lack %q", s.Args, want)
		}
	}
	if s.StartupProbe == nil || s.StartupProbe.HTTPGet == nil || s.StartupProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("sidecar startup probe = %+v, want GET /readyz", s.StartupProbe)
	}
	for _, e := range s.Env {
		if strings.Contains(strings.ToLower(e.Name), "proxy") {
			t.Errorf("sidecar got %s; proxy variables belong to the app containers only", e.Name)
		}
	}
	var tokenVol *corev1.Volume
	for i := range p.Spec.Volumes {
		if p.Spec.Volumes[i].Name == inject.TokenVolume {
			tokenVol = &p.Spec.Volumes[i]
		}
	}
	if tokenVol == nil || tokenVol.Projected == nil || len(tokenVol.Projected.Sources) != 1 || tokenVol.Projected.Sources[0].ServiceAccountToken == nil ||
		tokenVol.Projected.Sources[0].ServiceAccountToken.Audience != inject.TokenAudience {
		t.Fatalf("no projected token volume with audience %s: %+v", inject.TokenAudience, p.Spec.Volumes)
	}
	if !slices.ContainsFunc(s.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == inject.TokenVolume && m.MountPath == inject.TokenDir }) {
		t.Errorf("sidecar does not mount the token at %s: %v", inject.TokenDir, s.VolumeMounts)
	}
	for _, c := range p.Spec.Containers {
		for _, name := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
			if v, _ := envOf(c, name); v != "http://127.0.0.1:3128" {
				t.Errorf("container %s %s = %q, want http://127.0.0.1:3128", c.Name, name, v)
			}
		}
		np, _ := envOf(c, "NO_PROXY")
		for _, want := range []string{"localhost", "127.0.0.1", ".svc", ".cluster.local", "10.96.0.1", "10.96.0.0/12", "10.244.0.0/16"} {
			if !slices.Contains(strings.Split(np, ","), want) {
				t.Errorf("container %s NO_PROXY %q lacks %q", c.Name, np, want)
			}
		}
		if lower, _ := envOf(c, "no_proxy"); lower != np {
			t.Errorf("container %s no_proxy %q != NO_PROXY %q", c.Name, lower, np)
		}
	}
	if v, _ := envOf(p.Spec.Containers[0], "KEEP"); v != "me" {
		t.Errorf("the pod's own env was lost: %v", p.Spec.Containers[0].Env)
	}
}

// TestWebhookGivesTheSidecarTheClusterTargets: with the cluster's own
// ranges admitted (the chart's clusterTargets.cidrs), a pod the API server
// sends to the webhook comes back with a sidecar that admits them, and
// NO_PROXY as without them; a public range is refused at Setup.
func TestWebhookGivesTheSidecarTheClusterTargets(t *testing.T) {
	in := startInjection(t, func(c *inject.Config) {
		c.ClusterTargets = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}
	})
	p, err := in.create(t, crawlerPod(env.Namespace(t), map[string]string{inject.LabelInject: "true"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	assertInjected(t, p)
	if s := sidecars(p)[0]; !slices.Contains(s.Args, "--cluster-target-cidrs=10.244.0.0/16,10.96.0.0/12") {
		t.Errorf("sidecar args %q lack --cluster-target-cidrs=10.244.0.0/16,10.96.0.0/12", s.Args)
	}
	if np, _ := envOf(p.Spec.Containers[1], "NO_PROXY"); np != testConfig("").NoProxy(nil) {
		t.Errorf("NO_PROXY %q, want %q as without cluster targets", np, testConfig("").NoProxy(nil))
	}

	mgr, err := controller.NewManager(env.Config, controller.ManagerOptions{MetricsAddr: "0", HealthProbeAddr: "0"})
	if err != nil {
		t.Fatal(err)
	}
	bad := testConfig("x")
	bad.ClusterTargets = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	_, err = inject.Setup(mgr, inject.Options{Listen: "127.0.0.1:0", Config: bad, CertSecret: types.NamespacedName{Namespace: "x", Name: "y"},
		Configuration: "z", Hosts: []string{"127.0.0.1"}, Log: (&testutil.LogLines{}).Logger()})
	if err == nil || !strings.Contains(err.Error(), "--cluster-target-cidrs") || !strings.Contains(err.Error(), "203.0.113.0/24") {
		t.Errorf("Setup with a public cluster target: %v, want an error naming it", err)
	}
}

func TestWebhookInjectsOptedInPodsOnTheRealAPIServer(t *testing.T) {
	in := startInjection(t)
	plainNS := env.Namespace(t)
	labelledNS := env.Namespace(t)
	nsObj := &corev1.Namespace{}
	if err := env.Client.Get(in.ctx, client.ObjectKey{Name: labelledNS}, nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels[inject.LabelInject] = "true"
	if err := env.Client.Update(in.ctx, nsObj); err != nil {
		t.Fatal(err)
	}

	t.Run("a labelled pod gets the sidecar, the env and the projected token", func(t *testing.T) {
		p, err := in.create(t, crawlerPod(plainNS, map[string]string{inject.LabelInject: "true"}, nil))
		if err != nil {
			t.Fatal(err)
		}
		assertInjected(t, p)
		if p.Annotations[inject.AnnotationInjected] != "true" {
			t.Errorf("annotations %v lack %s", p.Annotations, inject.AnnotationInjected)
		}
	})
	t.Run("an unlabelled pod is untouched", func(t *testing.T) {
		p, err := in.create(t, crawlerPod(plainNS, nil, nil))
		if err != nil {
			t.Fatal(err)
		}
		if len(sidecars(p)) != 0 || len(p.Spec.InitContainers) != 0 {
			t.Fatalf("unlabelled pod was injected: %v", p.Spec.InitContainers)
		}
		if _, ok := envOf(p.Spec.Containers[0], "HTTPS_PROXY"); ok {
			t.Fatal("unlabelled pod got HTTPS_PROXY")
		}
	})
	t.Run("a pod in a labelled namespace is injected", func(t *testing.T) {
		p, err := in.create(t, crawlerPod(labelledNS, nil, nil))
		if err != nil {
			t.Fatal(err)
		}
		assertInjected(t, p)
	})
	t.Run("a pod labelled false opts out of a labelled namespace", func(t *testing.T) {
		p, err := in.create(t, crawlerPod(labelledNS, map[string]string{inject.LabelInject: "false"}, nil))
		if err != nil {
			t.Fatal(err)
		}
		if len(sidecars(p)) != 0 {
			t.Fatal("opted-out pod was injected")
		}
	})
	t.Run("a labelled pod in a labelled namespace passes both webhooks and gets one sidecar", func(t *testing.T) {
		p, err := in.create(t, crawlerPod(labelledNS, map[string]string{inject.LabelInject: "true"}, nil))
		if err != nil {
			t.Fatal(err)
		}
		assertInjected(t, p)
	})
	t.Run("re-submitting an injected pod does not inject twice", func(t *testing.T) {
		first, err := in.create(t, crawlerPod(plainNS, map[string]string{inject.LabelInject: "true"}, nil))
		if err != nil {
			t.Fatal(err)
		}
		again := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "again-", Namespace: plainNS,
			Labels: first.Labels, Annotations: first.Annotations}, Spec: *first.Spec.DeepCopy()}
		again.Spec.NodeName = ""
		p, err := in.create(t, again)
		if err != nil {
			t.Fatal(err)
		}
		assertInjected(t, p)
		if len(p.Spec.Volumes) != len(first.Spec.Volumes) {
			t.Errorf("re-submission has %d volumes, first had %d", len(p.Spec.Volumes), len(first.Spec.Volumes))
		}
	})
	t.Run("annotations tune the sidecar", func(t *testing.T) {
		p, err := in.create(t, crawlerPod(plainNS, map[string]string{inject.LabelInject: "true"}, map[string]string{
			inject.AnnotationSelector: "region=eu,tier=dc", inject.AnnotationRotation: "request",
			inject.AnnotationNoProxy: "internal.example.com,10.0.0.0/8", inject.AnnotationGatewayResources: "limits.memory=48Mi",
		}))
		if err != nil {
			t.Fatal(err)
		}
		s := sidecars(p)[0]
		for _, want := range []string{"--pool-selector=region=eu,tier=dc", "--rotation=request"} {
			if !slices.Contains(s.Args, want) {
				t.Errorf("sidecar args %q lack %q", s.Args, want)
			}
		}
		if got := s.Resources.Limits.Memory().String(); got != "48Mi" {
			t.Errorf("sidecar memory limit = %s, want 48Mi", got)
		}
		if got := s.Resources.Requests.Cpu().String(); got != "20m" {
			t.Errorf("sidecar cpu request = %s, want the controller's default 20m", got)
		}
		np, _ := envOf(p.Spec.Containers[1], "NO_PROXY")
		if !strings.HasSuffix(np, ",internal.example.com,10.0.0.0/8") {
			t.Errorf("NO_PROXY %q does not end with the annotation's hosts", np)
		}
	})
	t.Run("a bad annotation rejects the pod naming it", func(t *testing.T) {
		for _, tc := range []struct{ key, value string }{
			{inject.AnnotationRotation, "sometimes"},
			{inject.AnnotationSelector, "region"},
			{inject.AnnotationGatewayResources, "limits.memory=lots"},
			{inject.AnnotationNoProxy, "bad host!"},
			{inject.AnnotationMITM, "Not_A_Secret"},
			{inject.AnnotationUpstreamCA, "Not_A_ConfigMap"},
			{inject.AnnotationUpstreamCA, "site-roots/bad key!"},
			{inject.AnnotationUpstreamCA, "site-roots/"},
		} {
			_, err := in.create(t, crawlerPod(plainNS, map[string]string{inject.LabelInject: "true"}, map[string]string{tc.key: tc.value}))
			if err == nil || !strings.Contains(err.Error(), "annotation "+tc.key) {
				t.Errorf("%s=%q: got %v, want a denial naming the annotation", tc.key, tc.value, err)
			}
		}
	})
	t.Run("the MITM annotation mounts the CA certificate only into the app containers", func(t *testing.T) {
		p, err := in.create(t, crawlerPod(plainNS, map[string]string{inject.LabelInject: "true"}, map[string]string{inject.AnnotationMITM: "crawl-mitm-ca"}))
		if err != nil {
			t.Fatal(err)
		}
		s := sidecars(p)[0]
		if !slices.Equal(s.Command, []string{inject.MITMCommand}) {
			t.Errorf("a MITM pod's sidecar runs %q, want %s (the build with ClientHello mirroring)", s.Command, inject.MITMCommand)
		}
		for _, want := range []string{"--mitm-ca-cert=" + inject.MITMDir + "/tls.crt", "--mitm-ca-key=" + inject.MITMDir + "/tls.key"} {
			if !slices.Contains(s.Args, want) {
				t.Errorf("sidecar args %q lack %q", s.Args, want)
			}
		}
		for _, v := range p.Spec.Volumes {
			if v.Name == inject.MITMCAVolume && (v.Secret == nil || len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != corev1.TLSCertKey) {
				t.Errorf("app CA volume exposes more than tls.crt: %+v", v.Secret)
			}
		}
		for _, c := range p.Spec.Containers {
			for _, name := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"} {
				if v, _ := envOf(c, name); v != inject.MITMCAFile {
					t.Errorf("container %s %s = %q, want %s", c.Name, name, v, inject.MITMCAFile)
				}
			}
			if slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == inject.MITMVolume }) {
				t.Errorf("container %s mounts the CA key volume", c.Name)
			}
		}
	})
	t.Run("a proxy variable the container reads from a Secret is the same in both cases", func(t *testing.T) {
		pod := crawlerPod(plainNS, map[string]string{inject.LabelInject: "true"}, nil)
		fromSecret := &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "egress"}, Key: "proxy"}}
		pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: "HTTPS_PROXY", ValueFrom: fromSecret})
		p, err := in.create(t, pod)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"HTTPS_PROXY", "https_proxy"} {
			i := slices.IndexFunc(p.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == name })
			if i < 0 || p.Spec.Containers[0].Env[i].Value != "" || !equality.Semantic.DeepEqual(p.Spec.Containers[0].Env[i].ValueFrom, fromSecret) {
				t.Errorf("%s = %+v, want the container's own Secret key in both cases (clients read one case or the other)", name, p.Spec.Containers[0].Env)
			}
		}
		if v, _ := envOf(p.Spec.Containers[0], "http_proxy"); v != "http://127.0.0.1:3128" {
			t.Errorf("http_proxy = %q, want the sidecar (the container set only HTTPS_PROXY)", v)
		}
	})
	t.Run("a pod declaring a port the sidecar listens on is refused, saying which", func(t *testing.T) {
		for _, port := range []int32{3128, inject.ProbePort, 15091} {
			pod := crawlerPod(plainNS, map[string]string{inject.LabelInject: "true"}, nil)
			pod.Spec.Containers[1].Ports = []corev1.ContainerPort{{ContainerPort: port}}
			_, err := in.create(t, pod)
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("container parser declares port %d, which the injected", port)) {
				t.Fatalf("create with port %d = %v, want the pod denied naming the container and the port", port, err)
			}
		}
	})
	t.Run("a hostNetwork pod that asked for the sidecar is refused, saying why", func(t *testing.T) {
		pod := crawlerPod(plainNS, map[string]string{inject.LabelInject: "true"}, nil)
		pod.Spec.HostNetwork = true
		_, err := in.create(t, pod)
		if err == nil || !strings.Contains(err.Error(), "hostNetwork pods") || !strings.Contains(err.Error(), "remove the pod's "+inject.LabelInject+" label") {
			t.Fatalf("create = %v, want the pod denied saying why (it would start with the node's direct egress)", err)
		}
	})
	t.Run("a hostNetwork pod only its namespace opts in is left as it is", func(t *testing.T) {
		pod := crawlerPod(labelledNS, nil, nil)
		pod.Spec.HostNetwork = true
		p, err := in.create(t, pod)
		if err != nil {
			t.Fatal(err)
		}
		if len(sidecars(p)) != 0 {
			t.Fatal("a hostNetwork pod was injected")
		}
	})
	t.Run("the controller's own namespace is never injected", func(t *testing.T) {
		p, err := in.create(t, crawlerPod(in.secret.Namespace, map[string]string{inject.LabelInject: "true"}, nil))
		if err != nil {
			t.Fatal(err)
		}
		if len(sidecars(p)) != 0 {
			t.Fatal("a pod in the controller's namespace was injected")
		}
	})
	t.Run("the controller patches a stale caBundle", func(t *testing.T) {
		cfg := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := env.Client.Get(in.ctx, client.ObjectKey{Name: in.configName}, cfg); err != nil {
			t.Fatal(err)
		}
		stale := staleCA(t)
		for i := range cfg.Webhooks {
			cfg.Webhooks[i].ClientConfig.CABundle = stale
		}
		if err := env.Client.Update(in.ctx, cfg); err != nil {
			t.Fatal(err)
		}
		in.waitCABundle(t)
		p, err := in.create(t, crawlerPod(plainNS, map[string]string{inject.LabelInject: "true"}, nil))
		if err != nil {
			t.Fatal(err)
		}
		assertInjected(t, p)
	})
}
