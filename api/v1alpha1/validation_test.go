package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// env is the one real API server (with the CRDs from charts/proxyfleet/crds)
// that every test in this package shares; each test works in its own namespace.
var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// rawProxy builds a Proxy from a JSON spec, sent as-is: unlike the typed
// client it can carry explicit zeros (port: 0), as kubectl apply would.
func rawProxy(t *testing.T, ns, name, spec string) *unstructured.Unstructured {
	t.Helper()
	obj := map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "Proxy",
		"metadata":   map[string]any{"name": name, "namespace": ns},
	}
	if spec != "" {
		var s map[string]any
		if err := json.Unmarshal([]byte(spec), &s); err != nil {
			t.Fatalf("bad test spec %s: %v", spec, err)
		}
		obj["spec"] = s
	}
	return &unstructured.Unstructured{Object: obj}
}

func TestProxyValidationRejectsInvalidSpecs(t *testing.T) {
	ns := env.Namespace(t)
	tests := []struct {
		name string
		spec string // JSON; "" sends no spec at all
		want []string
	}{
		{
			name: "no spec at all",
			spec: "",
			want: []string{"spec: Required value"},
		},
		{
			name: "External without endpoint",
			spec: `{"mode":"External"}`,
			want: []string{"mode External needs spec.endpoint (host and port of the existing proxy)"},
		},
		{
			name: "External with a provider",
			spec: `{"mode":"External","provider":"gcp-eu","endpoint":{"host":"127.0.0.1","port":3128}}`,
			want: []string{"mode External must not set spec.provider"},
		},
		{
			name: "External with cloud-init",
			spec: `{"mode":"External","endpoint":{"host":"127.0.0.1","port":3128},"cloudInit":{"inline":"#cloud-config"}}`,
			want: []string{"mode External must not set spec.placement or spec.cloudInit"},
		},
		{
			name: "Managed without provider",
			spec: `{"mode":"Managed"}`,
			want: []string{"mode Managed needs spec.provider, the name of an entry in the controller's providers config"},
		},
		{
			name: "default mode (Managed) without provider",
			spec: `{"port":3128}`,
			want: []string{"mode Managed needs spec.provider"},
		},
		{
			name: "Managed with an endpoint",
			spec: `{"provider":"in-cluster","endpoint":{"host":"127.0.0.1","port":3128}}`,
			want: []string{"mode Managed must not set spec.endpoint"},
		},
		{
			name: "unknown mode",
			spec: `{"mode":"Borrowed","provider":"in-cluster"}`,
			want: []string{`spec.mode: Unsupported value: "Borrowed"`, `"Managed"`, `"External"`},
		},
		{
			name: "provider name that is not a DNS-1123 label",
			spec: `{"provider":"GCP_eu"}`,
			want: []string{"provider must be a DNS-1123 label"},
		},
		{
			name: "port 0",
			spec: `{"provider":"in-cluster","port":0}`,
			want: []string{"spec.port", "should be greater than or equal to 1"},
		},
		{
			name: "port 70000",
			spec: `{"provider":"in-cluster","port":70000}`,
			want: []string{"spec.port", "should be less than or equal to 65535"},
		},
		{
			name: "endpoint port 0",
			spec: `{"mode":"External","endpoint":{"host":"127.0.0.1","port":0}}`,
			want: []string{"spec.endpoint.port", "should be greater than or equal to 1"},
		},
		{
			name: "endpoint port 70000",
			spec: `{"mode":"External","endpoint":{"host":"127.0.0.1","port":70000}}`,
			want: []string{"spec.endpoint.port", "should be less than or equal to 65535"},
		},
		{
			name: "endpoint without host",
			spec: `{"mode":"External","endpoint":{"port":3128}}`,
			want: []string{"spec.endpoint.host: Required value"},
		},
		{
			name: "endpoint host given as a URL",
			spec: `{"mode":"External","endpoint":{"host":"http://squid:3128/","port":3128}}`,
			want: []string{"endpoint.host is a host name or IP address, not a URL"},
		},
		{
			name: "endpoint scheme that is not http, https or socks5",
			spec: `{"mode":"External","endpoint":{"host":"127.0.0.1","port":3128,"scheme":"ftp"}}`,
			want: []string{`spec.endpoint.scheme: Unsupported value: "ftp"`, `"http"`, `"https"`, `"socks5"`},
		},
		{
			name: "credentialsSecretRef without a name",
			spec: `{"mode":"External","endpoint":{"host":"127.0.0.1","port":3128,"credentialsSecretRef":{}}}`,
			want: []string{"spec.endpoint.credentialsSecretRef.name: Required value"},
		},
		{
			name: "endpoint host with a port",
			spec: `{"mode":"External","endpoint":{"host":"gw.vendor.example:8000","port":8000}}`,
			want: []string{"spec.endpoint.host", "without a port (set endpoint.port)"},
		},
		{
			name: "endpoint host with a login",
			spec: `{"mode":"External","endpoint":{"host":"user@gw.vendor.example","port":8000}}`,
			want: []string{"spec.endpoint.host", "or a login (set endpoint.credentialsSecretRef)"},
		},
		{
			name: "cloud-init Secret name that is not a Secret name",
			spec: `{"provider":"kvm-home","cloudInit":{"secretRef":{"name":"Not_A_Secret_Name"}}}`,
			want: []string{"spec.cloudInit.secretRef.name", "cloudInit.secretRef.name must be a Secret name"},
		},
		{
			name: "cloud-init Secret key that is not a Secret key",
			spec: `{"provider":"kvm-home","cloudInit":{"secretRef":{"name":"squid-user-data","key":"user data!"}}}`,
			want: []string{"spec.cloudInit.secretRef.key", "cloudInit.secretRef.key must be a Secret key"},
		},
		{
			name: "credentialsSecretRef name that is not a Secret name",
			spec: `{"mode":"External","endpoint":{"host":"127.0.0.1","port":3128,"credentialsSecretRef":{"name":"Squid_Login"}}}`,
			want: []string{"spec.endpoint.credentialsSecretRef.name", "credentialsSecretRef.name must be a Secret name"},
		},
		{
			name: "failureThreshold 0",
			spec: `{"provider":"in-cluster","healthCheck":{"failureThreshold":0}}`,
			want: []string{"spec.healthCheck.failureThreshold", "should be greater than or equal to 1"},
		},
		{
			name: "successThreshold 0",
			spec: `{"provider":"in-cluster","healthCheck":{"successThreshold":0}}`,
			want: []string{"spec.healthCheck.successThreshold", "should be greater than or equal to 1"},
		},
		{
			name: "intervalSeconds 0",
			spec: `{"provider":"in-cluster","healthCheck":{"intervalSeconds":0}}`,
			want: []string{"spec.healthCheck.intervalSeconds", "should be greater than or equal to 1"},
		},
		{
			name: "timeout longer than the interval",
			spec: `{"provider":"in-cluster","healthCheck":{"intervalSeconds":5,"timeoutSeconds":10}}`,
			want: []string{"healthCheck.timeoutSeconds must not exceed healthCheck.intervalSeconds (default 10)"},
		},
		{
			name: "timeout longer than the default interval",
			spec: `{"provider":"in-cluster","healthCheck":{"timeoutSeconds":11}}`,
			want: []string{"healthCheck.timeoutSeconds must not exceed healthCheck.intervalSeconds (default 10)"},
		},
		{
			name: "expected status that is no HTTP status",
			spec: `{"provider":"in-cluster","healthCheck":{"expectedStatus":99}}`,
			want: []string{"spec.healthCheck.expectedStatus", "should be greater than or equal to 100"},
		},
		{
			name: "probe URL that is not http(s)",
			spec: `{"provider":"in-cluster","healthCheck":{"url":"ftp://127.0.0.1/"}}`,
			want: []string{"healthCheck.url must be an http:// or https:// URL"},
		},
		{
			name: "cloud-init inline and secretRef both set",
			spec: `{"provider":"in-cluster","cloudInit":{"inline":"#cloud-config","secretRef":{"name":"ci"}}}`,
			want: []string{"cloudInit needs exactly one of inline or secretRef"},
		},
		{
			name: "cloud-init with neither inline nor secretRef",
			spec: `{"provider":"in-cluster","cloudInit":{}}`,
			want: []string{"cloudInit needs exactly one of inline or secretRef"},
		},
		{
			name: "cloud-init secretRef without a name",
			spec: `{"provider":"in-cluster","cloudInit":{"secretRef":{"key":"user-data"}}}`,
			want: []string{"spec.cloudInit.secretRef.name: Required value"},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			obj := rawProxy(t, ns, "invalid-"+strconv.Itoa(i), tc.spec)
			err := env.Client.Create(ctx(t), obj)
			if err == nil {
				t.Fatalf("API server accepted %s; want it rejected with %q", tc.spec, tc.want)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want an Invalid error, got %v", err)
			}
			t.Logf("kubectl would print: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err.Error(), w)
				}
			}
		})
	}
}

func TestProxyValidationAcceptsValidSpecs(t *testing.T) {
	ns := env.Namespace(t)
	tests := []struct {
		name string
		spec string
	}{
		{"minimal Managed", `{"provider":"in-cluster"}`},
		{"External with an endpoint", `{"mode":"External","endpoint":{"host":"127.0.0.1","port":3128},"attributes":{"region":"eu"}}`},
		{"External with an IPv6 endpoint", `{"mode":"External","endpoint":{"host":"::1","port":3128}}`},
		{"External with a full IPv6 endpoint", `{"mode":"External","endpoint":{"host":"2001:db8::1","port":3128}}`},
		{"External socks5 with a login", `{"mode":"External","endpoint":{"host":"gw.example.net","port":1080,"scheme":"socks5","credentialsSecretRef":{"name":"vendor.login-1"}}}`},
		{"External https", `{"mode":"External","endpoint":{"host":"gw.example.net","port":443,"scheme":"https"}}`},
		{"Managed with everything", `{"mode":"Managed","provider":"gcp-eu","port":8080,
			"placement":{"zone":"europe-west1-b","machineType":"e2-micro","image":"projects/debian-cloud/global/images/family/debian-12"},
			"cloudInit":{"inline":"#cloud-config\n"},"attributes":{"region":"eu","tier":"dc"},
			"healthCheck":{"url":"https://127.0.0.1:8443/ok","intervalSeconds":30,"timeoutSeconds":30,"successThreshold":2,"failureThreshold":5,"expectedStatus":204}}`},
		{"Managed with cloud-init from a Secret", `{"provider":"kvm-home","cloudInit":{"secretRef":{"name":"squid-user-data","key":"cloud-config"}}}`},
		{"port 1 is in range", `{"provider":"in-cluster","port":1}`},
		{"port 65535 is in range", `{"provider":"in-cluster","port":65535}`},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := env.Client.Create(ctx(t), rawProxy(t, ns, "valid-"+strconv.Itoa(i), tc.spec)); err != nil {
				t.Fatalf("API server rejected a valid spec: %v", err)
			}
		})
	}
}

func TestProxyDefaultsAreApplied(t *testing.T) {
	ns := env.Namespace(t)
	c := ctx(t)

	t.Run("minimal Managed proxy gets mode, port and health check defaults", func(t *testing.T) {
		p := &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Name: "minimal", Namespace: ns},
			Spec:       v1alpha1.ProxySpec{Provider: "in-cluster"},
		}
		if err := env.Client.Create(c, p); err != nil {
			t.Fatalf("create: %v", err)
		}
		var got v1alpha1.Proxy
		if err := env.Client.Get(c, client.ObjectKeyFromObject(p), &got); err != nil {
			t.Fatalf("get: %v", err)
		}
		if got.Spec.Mode != v1alpha1.ModeManaged {
			t.Errorf("mode = %q, want Managed", got.Spec.Mode)
		}
		if got.Spec.Port != 3128 || v1alpha1.DefaultPort != 3128 {
			t.Errorf("port = %d, want 3128", got.Spec.Port)
		}
		// The API server stores no timeout default (it depends on the
		// interval); WithDefaults fills it.
		want := v1alpha1.HealthCheck{IntervalSeconds: 10, SuccessThreshold: 1, FailureThreshold: 3, ExpectedStatus: 200}
		if got.Spec.HealthCheck != want {
			t.Errorf("healthCheck = %+v, want %+v", got.Spec.HealthCheck, want)
		}
		// The Go-side defaults must agree with the API server's.
		withTimeout := want
		withTimeout.TimeoutSeconds = 5
		if d := (v1alpha1.HealthCheck{}).WithDefaults(); d != withTimeout {
			t.Errorf("HealthCheck{}.WithDefaults() = %+v, want the API server's defaults and a 5s timeout %+v", d, withTimeout)
		}
		if d := want.WithDefaults(); d != withTimeout {
			t.Errorf("the stored defaults WithDefaults() = %+v, want %+v", d, withTimeout)
		}
	})

	t.Run("a one-second interval alone is accepted and probes time out within it", func(t *testing.T) {
		p := rawProxy(t, ns, "fast", `{"provider":"in-cluster","healthCheck":{"intervalSeconds":1}}`)
		if err := env.Client.Create(c, p); err != nil {
			t.Fatalf("a Proxy that only sets intervalSeconds: 1 was refused: %v", err)
		}
		var got v1alpha1.Proxy
		if err := env.Client.Get(c, client.ObjectKey{Namespace: ns, Name: "fast"}, &got); err != nil {
			t.Fatalf("get: %v", err)
		}
		if d := got.Spec.HealthCheck.Timeout(); d != time.Second {
			t.Errorf("timeout %s, want the 1s interval", d)
		}
	})

	t.Run("a partly set health check keeps its values and defaults the rest", func(t *testing.T) {
		p := rawProxy(t, ns, "partial", `{"provider":"in-cluster","healthCheck":{"url":"http://127.0.0.1:9/","failureThreshold":7}}`)
		if err := env.Client.Create(c, p); err != nil {
			t.Fatalf("create: %v", err)
		}
		var got v1alpha1.Proxy
		if err := env.Client.Get(c, client.ObjectKey{Namespace: ns, Name: "partial"}, &got); err != nil {
			t.Fatalf("get: %v", err)
		}
		want := v1alpha1.HealthCheck{URL: "http://127.0.0.1:9/", IntervalSeconds: 10, SuccessThreshold: 1, FailureThreshold: 7, ExpectedStatus: 200}
		if got.Spec.HealthCheck != want {
			t.Errorf("healthCheck = %+v, want %+v", got.Spec.HealthCheck, want)
		}
	})

	t.Run("cloud-init secretRef key defaults to user-data", func(t *testing.T) {
		p := &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Name: "secretref", Namespace: ns},
			Spec: v1alpha1.ProxySpec{
				Provider:  "kvm-home",
				CloudInit: &v1alpha1.CloudInit{SecretRef: &v1alpha1.SecretKeyRef{Name: "squid-user-data"}},
			},
		}
		if err := env.Client.Create(c, p); err != nil {
			t.Fatalf("create: %v", err)
		}
		var got v1alpha1.Proxy
		if err := env.Client.Get(c, client.ObjectKeyFromObject(p), &got); err != nil {
			t.Fatalf("get: %v", err)
		}
		if got.Spec.CloudInit == nil || got.Spec.CloudInit.SecretRef == nil || got.Spec.CloudInit.SecretRef.Key != v1alpha1.DefaultCloudInitSecretKey {
			t.Errorf("cloudInit = %+v, want secretRef.key %q", got.Spec.CloudInit, v1alpha1.DefaultCloudInitSecretKey)
		}
	})
}

func TestProxyStatusSubresource(t *testing.T) {
	ns := env.Namespace(t)
	c := ctx(t)
	p := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: "status", Namespace: ns},
		Spec:       v1alpha1.ProxySpec{Mode: v1alpha1.ModeExternal, Endpoint: &v1alpha1.Endpoint{Host: "127.0.0.1", Port: 3128}},
		Status:     v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: "127.0.0.9"},
	}
	if err := env.Client.Create(c, p); err != nil {
		t.Fatalf("create: %v", err)
	}

	t.Run("status sent with create is ignored", func(t *testing.T) {
		var got v1alpha1.Proxy
		if err := env.Client.Get(c, client.ObjectKeyFromObject(p), &got); err != nil {
			t.Fatalf("get: %v", err)
		}
		if got.Status.Phase != "" || got.Status.IP != "" {
			t.Errorf("status = %+v, want empty: only the status subresource writes status", got.Status)
		}
	})

	t.Run("status subresource stores phase, conditions and latency", func(t *testing.T) {
		var got v1alpha1.Proxy
		if err := env.Client.Get(c, client.ObjectKeyFromObject(p), &got); err != nil {
			t.Fatalf("get: %v", err)
		}
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		got.Status = v1alpha1.ProxyStatus{
			Phase: v1alpha1.PhaseReady, IP: "127.0.0.1", LatencyMillis: 12, LastHealthCheckTime: &now,
			ObservedGeneration: got.Generation,
			Conditions: []metav1.Condition{
				{Type: v1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonExternalEndpoint, Message: "external", LastTransitionTime: now},
				{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, Message: "ok", LastTransitionTime: now},
			},
		}
		if err := env.Client.Status().Update(c, &got); err != nil {
			t.Fatalf("status update: %v", err)
		}
		var back v1alpha1.Proxy
		if err := env.Client.Get(c, client.ObjectKeyFromObject(p), &back); err != nil {
			t.Fatalf("get: %v", err)
		}
		if back.Status.Phase != v1alpha1.PhaseReady || back.Status.LatencyMillis != 12 || !back.IsHealthy() || back.Address() != "127.0.0.1:3128" {
			t.Errorf("status after update = %+v", back.Status)
		}
	})

	t.Run("unknown phase is rejected", func(t *testing.T) {
		var got v1alpha1.Proxy
		if err := env.Client.Get(c, client.ObjectKeyFromObject(p), &got); err != nil {
			t.Fatalf("get: %v", err)
		}
		got.Status.Phase = "Sleeping"
		err := env.Client.Status().Update(c, &got)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `status.phase: Unsupported value: "Sleeping"`) {
			t.Errorf("status update with phase Sleeping: got %v, want Unsupported value", err)
		}
	})
}

func TestDiscoveryShortNamesAndScope(t *testing.T) {
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatalf("discovery client: %v", err)
	}
	list, err := dc.ServerResourcesForGroupVersion(v1alpha1.GroupVersion.String())
	if err != nil {
		t.Fatalf("discover %s: %v", v1alpha1.GroupVersion, err)
	}
	tests := []struct {
		resource   string
		shortName  string
		namespaced bool
	}{
		{"proxies", "px", true},
		{"proxypools", "pxp", true},
		{"providerhealths", "ph", false},
	}
	for _, tc := range tests {
		t.Run(tc.resource+" is "+tc.shortName, func(t *testing.T) {
			for _, r := range list.APIResources {
				if r.Name != tc.resource {
					continue
				}
				if len(r.ShortNames) != 1 || r.ShortNames[0] != tc.shortName {
					t.Errorf("short names = %v, want [%s]", r.ShortNames, tc.shortName)
				}
				if r.Namespaced != tc.namespaced {
					t.Errorf("namespaced = %v, want %v", r.Namespaced, tc.namespaced)
				}
				return
			}
			t.Fatalf("resource %s not served", tc.resource)
		})
	}
}

// table asks the API server for the kubectl-get table of a resource, which
// it renders from the CRD's printer columns.
// table asks the API server for path as a server-side Table, as kubectl get
// does. It goes through client-go's REST client, not a bare HTTP client, so a
// 429 from the server's priority-and-fairness filter on a busy machine is
// retried after its Retry-After, as kubectl would.
func table(t *testing.T, path string) *metav1.Table {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath(path).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
		DoRaw(ctx(t))
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	var tb metav1.Table
	if err := json.Unmarshal(raw, &tb); err != nil {
		t.Fatalf("decode table: %v", err)
	}
	return &tb
}

func columns(tb *metav1.Table) []string {
	var names []string
	for _, c := range tb.ColumnDefinitions {
		if c.Priority == 0 {
			names = append(names, c.Name)
		}
	}
	return names
}

func TestPrinterColumns(t *testing.T) {
	ns := env.Namespace(t)
	c := ctx(t)

	t.Run("kubectl get px shows phase, provider, IP, latency and age", func(t *testing.T) {
		p := &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Name: "cols", Namespace: ns},
			Spec:       v1alpha1.ProxySpec{Provider: "in-cluster"},
		}
		if err := env.Client.Create(c, p); err != nil {
			t.Fatalf("create: %v", err)
		}
		p.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: "127.0.0.7", LatencyMillis: 42}
		if err := env.Client.Status().Update(c, p); err != nil {
			t.Fatalf("status update: %v", err)
		}
		tb := table(t, "/apis/proxyfleet.io/v1alpha1/namespaces/"+ns+"/proxies")
		want := []string{"Name", "Phase", "Provider", "IP", "Latency", "Age"}
		if got := columns(tb); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("columns = %v, want %v", got, want)
		}
		if len(tb.Rows) != 1 {
			t.Fatalf("rows = %d, want 1", len(tb.Rows))
		}
		cells := tb.Rows[0].Cells
		if cells[0] != "cols" || cells[1] != "Ready" || cells[2] != "in-cluster" || cells[3] != "127.0.0.7" || cells[4] != float64(42) {
			t.Errorf("row = %v, want [cols Ready in-cluster 127.0.0.7 42 <age>]", cells)
		}
	})

	t.Run("kubectl get ph shows type, ready, targets, last check and age", func(t *testing.T) {
		ph := &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{
			Name:   "cols-" + ns,
			Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue},
		}}
		if err := env.Client.Create(c, ph); err != nil {
			t.Fatalf("create: %v", err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ph) })
		tb := table(t, "/apis/proxyfleet.io/v1alpha1/providerhealths")
		want := []string{"Name", "Type", "Ready", "Targets", "Last Check", "Age"}
		if got := columns(tb); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("columns = %v, want %v", got, want)
		}
	})
}

func TestProviderHealthStatus(t *testing.T) {
	c := ctx(t)
	ph := &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{
		Name:   "kvm-home",
		Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue},
	}}
	if err := env.Client.Create(c, ph); err != nil {
		t.Fatalf("create cluster-scoped ProviderHealth: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ph) })
	if ph.Namespace != "" {
		t.Errorf("namespace = %q, want cluster-scoped", ph.Namespace)
	}

	now := metav1.NewTime(time.Now().Truncate(time.Second))
	ph.Status = v1alpha1.ProviderHealthStatus{
		Type: "kvm", Ready: false, TargetsReady: "1/2", LastCheckTime: &now,
		Targets: []v1alpha1.ProviderTarget{
			{Name: "beelink", Ready: true, Reason: "Reachable", Details: map[string]string{"poolAvailableGiB": "120"}, LastTransitionTime: now},
			{Name: "nuc", Ready: false, Reason: "Unreachable", Message: "dial tcp: connection refused", LastTransitionTime: now},
		},
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "TargetsNotReady", Message: "1 of 2 targets not ready", LastTransitionTime: now}},
	}
	if err := env.Client.Status().Update(c, ph); err != nil {
		t.Fatalf("status update: %v", err)
	}
	var got v1alpha1.ProviderHealth
	if err := env.Client.Get(c, client.ObjectKeyFromObject(ph), &got); err != nil {
		t.Fatalf("get: %v", err)
	}
	if got.Status.Type != "kvm" || got.Status.Ready || got.Status.TargetsReady != "1/2" || len(got.Status.Targets) != 2 ||
		got.Status.Targets[0].Details["poolAvailableGiB"] != "120" || got.Status.Targets[1].Message != "dial tcp: connection refused" {
		t.Errorf("status = %+v", got.Status)
	}

	t.Run("two targets with the same name are rejected", func(t *testing.T) {
		dup := got.DeepCopy()
		dup.Status.Targets = append(dup.Status.Targets, v1alpha1.ProviderTarget{Name: "nuc", LastTransitionTime: now})
		err := env.Client.Status().Update(c, dup)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "Duplicate value") {
			t.Errorf("duplicate target: got %v, want Duplicate value", err)
		}
	})
}

func TestProxyModeAndProviderAreImmutable(t *testing.T) {
	ns := env.Namespace(t)
	c := ctx(t)
	tests := []struct {
		name   string
		create string
		edit   func(*v1alpha1.Proxy)
		want   string
	}{
		{
			name:   "provider cannot move a Managed proxy to another provider",
			create: `{"provider":"in-cluster"}`,
			edit:   func(p *v1alpha1.Proxy) { p.Spec.Provider = "gcp-eu" },
			want:   "spec.provider is immutable",
		},
		{
			name:   "mode cannot switch a Managed proxy to External",
			create: `{"provider":"in-cluster"}`,
			edit: func(p *v1alpha1.Proxy) {
				p.Spec.Mode, p.Spec.Provider = v1alpha1.ModeExternal, ""
				p.Spec.Endpoint = &v1alpha1.Endpoint{Host: "10.0.0.1", Port: 3128}
			},
			want: "spec.mode is immutable",
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("immutable-%d", i)
			if err := env.Client.Create(c, rawProxy(t, ns, name, tc.create)); err != nil {
				t.Fatalf("create: %v", err)
			}
			var p v1alpha1.Proxy
			if err := env.Client.Get(c, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
				t.Fatalf("get: %v", err)
			}
			tc.edit(&p)
			err := env.Client.Update(c, &p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("update error = %v, want one containing %q", err, tc.want)
			}
		})
	}

	t.Run("other spec fields stay editable", func(t *testing.T) {
		if err := env.Client.Create(c, rawProxy(t, ns, "editable", `{"provider":"in-cluster"}`)); err != nil {
			t.Fatalf("create: %v", err)
		}
		var p v1alpha1.Proxy
		if err := env.Client.Get(c, client.ObjectKey{Namespace: ns, Name: "editable"}, &p); err != nil {
			t.Fatalf("get: %v", err)
		}
		p.Spec.Port = 8080
		p.Spec.Attributes = map[string]string{"region": "eu"}
		if err := env.Client.Update(c, &p); err != nil {
			t.Fatalf("update of port and attributes: %v", err)
		}
	})
}
