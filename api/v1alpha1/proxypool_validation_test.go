package v1alpha1_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// minimalTemplate is a template the API server accepts, for pools whose
// test is about something else.
const minimalTemplate = `"template":{"spec":{"provider":"in-cluster"}}`

// rawPool builds a ProxyPool from a JSON spec sent as-is (explicit zeros
// included, as kubectl apply would send them).
func rawPool(t *testing.T, ns, name, spec string) *unstructured.Unstructured {
	t.Helper()
	var s map[string]any
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		t.Fatalf("bad test spec %s: %v", spec, err)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "ProxyPool",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       s,
	}}
}

func TestProxyPoolValidationRejectsInvalidSpecs(t *testing.T) {
	ns := env.Namespace(t)
	tests := []struct {
		name     string
		poolName string // "" means invalid-<i>
		spec     string
		want     []string
	}{
		{
			name: "no template",
			spec: `{"replicas":2}`,
			want: []string{"spec.template: Required value"},
		},
		{
			name: "template whose Proxy spec is invalid",
			spec: `{"template":{"spec":{"mode":"External"}}}`,
			want: []string{"spec.template.spec", "mode External needs spec.endpoint"},
		},
		{
			name: "negative replicas",
			spec: `{"replicas":-1,` + minimalTemplate + `}`,
			want: []string{"spec.replicas", "should be greater than or equal to 0"},
		},
		{
			name: "maxSurge and maxUnavailable both 0",
			spec: `{"maxSurge":0,"maxUnavailable":0,` + minimalTemplate + `}`,
			want: []string{"maxSurge and maxUnavailable must not both be 0"},
		},
		{
			name: "negative maxUnavailable",
			spec: `{"maxUnavailable":-1,` + minimalTemplate + `}`,
			want: []string{"spec.maxUnavailable", "should be greater than or equal to 0"},
		},
		{
			name: "maxAge that is not a duration",
			spec: `{"maxAge":"1 day",` + minimalTemplate + `}`,
			want: []string{"spec.maxAge", "maxAge must be a positive Go duration such as 30m or 24h"},
		},
		{
			name: "replaceUnhealthyAfter that is not a duration",
			spec: `{"replaceUnhealthyAfter":"five minutes",` + minimalTemplate + `}`,
			want: []string{"spec.replaceUnhealthyAfter", "replaceUnhealthyAfter must be a Go duration such as 5m, or 0 to never replace"},
		},
		{
			name: "negative replaceUnhealthyAfter",
			spec: `{"replaceUnhealthyAfter":"-5m",` + minimalTemplate + `}`,
			want: []string{"spec.replaceUnhealthyAfter", "replaceUnhealthyAfter must be a Go duration"},
		},
		{
			name: "recycle without bannedSites",
			spec: `{"recycle":{"window":"1h"},` + minimalTemplate + `}`,
			want: []string{"spec.recycle.bannedSites: Required value"},
		},
		{
			name: "recycle at zero sites",
			spec: `{"recycle":{"bannedSites":0},` + minimalTemplate + `}`,
			want: []string{"spec.recycle.bannedSites", "greater than or equal to 1"},
		},
		{
			name: "recycle window that is not a duration",
			spec: `{"recycle":{"bannedSites":3,"window":"an hour"},` + minimalTemplate + `}`,
			want: []string{"spec.recycle.window", "recycle.window must be a positive Go duration such as 30m or 1h"},
		},
		{
			name: "recycle window of zero",
			spec: `{"recycle":{"bannedSites":3,"window":"0s"},` + minimalTemplate + `}`,
			want: []string{"spec.recycle.window", "recycle.window must be a positive Go duration"},
		},
		{
			name: "maxAge of zero",
			spec: `{"maxAge":"0s",` + minimalTemplate + `}`,
			want: []string{"spec.maxAge", "maxAge must be a positive Go duration"},
		},
		{
			name: "negative drainSeconds",
			spec: `{"drainSeconds":-5,` + minimalTemplate + `}`,
			want: []string{"spec.drainSeconds", "should be greater than or equal to 0"},
		},
		{
			name: "template labels that take the pool's own label",
			spec: `{"template":{"metadata":{"labels":{"proxyfleet.io/pool":"other"}},"spec":{"provider":"in-cluster"}}}`,
			want: []string{"spec.template.metadata.labels", "must not set proxyfleet.io/pool"},
		},
		{
			name: "autoscaling without maxReplicas",
			spec: `{"autoscaling":{"minReplicas":1},` + minimalTemplate + `}`,
			want: []string{"spec.autoscaling.maxReplicas: Required value"},
		},
		{
			name: "autoscaling with minReplicas above maxReplicas",
			spec: `{"autoscaling":{"minReplicas":5,"maxReplicas":3},` + minimalTemplate + `}`,
			want: []string{"spec.autoscaling", "autoscaling.minReplicas must not exceed autoscaling.maxReplicas"},
		},
		{
			name: "autoscaling with the default minReplicas (1) above maxReplicas 0",
			spec: `{"autoscaling":{"maxReplicas":0},` + minimalTemplate + `}`,
			want: []string{"spec.autoscaling.maxReplicas", "should be greater than or equal to 1"},
		},
		{
			name: "autoscaling with a target of 0 leases per Proxy",
			spec: `{"autoscaling":{"maxReplicas":3,"targetLeasesPerProxy":0},` + minimalTemplate + `}`,
			want: []string{"spec.autoscaling.targetLeasesPerProxy", "should be greater than or equal to 1"},
		},
		{
			name:     "a name longer than a label value",
			poolName: strings.Repeat("p", 64),
			spec:     `{` + minimalTemplate + `}`,
			want:     []string{"a ProxyPool name is at most 63 characters"},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := tc.poolName
			if name == "" {
				name = "invalid-" + strconv.Itoa(i)
			}
			err := env.Client.Create(ctx(t), rawPool(t, ns, name, tc.spec))
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

func TestProxyPoolValidationAcceptsValidSpecs(t *testing.T) {
	ns := env.Namespace(t)
	tests := []struct {
		name string
		spec string
	}{
		{"minimal", `{` + minimalTemplate + `}`},
		{"zero replicas", `{"replicas":0,` + minimalTemplate + `}`},
		{"maxUnavailable 0 with a surge", `{"maxUnavailable":0,"maxSurge":2,` + minimalTemplate + `}`},
		{"maxSurge 0 with maxUnavailable", `{"maxSurge":0,"maxUnavailable":1,` + minimalTemplate + `}`},
		{"maxAge in minutes and fractions", `{"maxAge":"1.5h",` + minimalTemplate + `}`},
		{"replaceUnhealthyAfter off", `{"replaceUnhealthyAfter":"0",` + minimalTemplate + `}`},
		{"replaceUnhealthyAfter in seconds", `{"replaceUnhealthyAfter":"90s",` + minimalTemplate + `}`},
		{"recycle after three sites in half an hour", `{"recycle":{"bannedSites":3,"window":"30m"},` + minimalTemplate + `}`},
		{"autoscaling down to zero", `{"autoscaling":{"minReplicas":0,"maxReplicas":1},` + minimalTemplate + `}`},
		{"everything", `{"replicas":3,"maxAge":"24h","maxSurge":1,"maxUnavailable":0,"drainSeconds":120,
			"autoscaling":{"minReplicas":2,"maxReplicas":20,"targetLeasesPerProxy":5,"scaleDownDelaySeconds":60},
			"template":{"metadata":{"labels":{"team":"crawl"}},"spec":{"provider":"gcp-eu","attributes":{"region":"eu"},
			"placement":{"zone":"europe-west1-b"}}}}`},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := env.Client.Create(ctx(t), rawPool(t, ns, "valid-"+strconv.Itoa(i), tc.spec)); err != nil {
				t.Fatalf("API server rejected a valid pool: %v", err)
			}
		})
	}
}

func TestProxyPoolDefaultsAreApplied(t *testing.T) {
	ns := env.Namespace(t)
	c := ctx(t)
	if err := env.Client.Create(c, rawPool(t, ns, "defaults", `{"autoscaling":{"maxReplicas":4},`+minimalTemplate+`}`)); err != nil {
		t.Fatalf("create: %v", err)
	}
	var got v1alpha1.ProxyPool
	if err := env.Client.Get(c, client.ObjectKey{Namespace: ns, Name: "defaults"}, &got); err != nil {
		t.Fatalf("get: %v", err)
	}
	s := got.Spec
	if s.Replicas == nil || *s.Replicas != v1alpha1.DefaultPoolReplicas {
		t.Errorf("replicas = %v, want %d (so /scale always has a value)", s.Replicas, v1alpha1.DefaultPoolReplicas)
	}
	if s.MaxSurge == nil || *s.MaxSurge != v1alpha1.DefaultPoolMaxSurge ||
		s.MaxUnavailable == nil || *s.MaxUnavailable != v1alpha1.DefaultPoolMaxUnavailable {
		t.Errorf("maxSurge/maxUnavailable = %v/%v, want 1/1", s.MaxSurge, s.MaxUnavailable)
	}
	if s.ReplaceUnhealthyAfter == nil || s.ReplaceUnhealthyAfter.Duration != v1alpha1.DefaultReplaceUnhealthyAfter {
		t.Errorf("replaceUnhealthyAfter = %v, want %s", s.ReplaceUnhealthyAfter, v1alpha1.DefaultReplaceUnhealthyAfter)
	}
	if s.Recycle != nil {
		t.Errorf("recycle = %+v, want unset (off) unless asked for", s.Recycle)
	}
	if s.DrainSeconds == nil || *s.DrainSeconds != v1alpha1.DefaultPoolDrainSeconds {
		t.Errorf("drainSeconds = %v, want %d", s.DrainSeconds, v1alpha1.DefaultPoolDrainSeconds)
	}
	a := s.Autoscaling
	if a.MinReplicas == nil || *a.MinReplicas != v1alpha1.DefaultAutoscalingMinReplicas ||
		a.TargetLeasesPerProxy != v1alpha1.DefaultTargetLeasesPerProxy ||
		a.ScaleDownDelaySeconds == nil || *a.ScaleDownDelaySeconds != v1alpha1.DefaultScaleDownDelaySeconds {
		t.Errorf("autoscaling = %+v, want min 1, target 10, delay 300", a)
	}
	// The template's Proxy spec is defaulted as a Proxy's is, so a Proxy
	// stamped from it hashes the same as the template.
	if s.Template.Spec.Mode != v1alpha1.ModeManaged || s.Template.Spec.Port != v1alpha1.DefaultPort ||
		s.Template.Spec.HealthCheck.IntervalSeconds != v1alpha1.DefaultHealthCheckIntervalSeconds {
		t.Errorf("template spec = %+v, want Proxy defaults", s.Template.Spec)
	}
	// The Go helpers agree with the API server on an object without defaults.
	var bare v1alpha1.ProxyPool
	if bare.Replicas() != *s.Replicas || bare.MaxSurge() != *s.MaxSurge || bare.MaxUnavailable() != *s.MaxUnavailable ||
		bare.DrainTimeout().Seconds() != float64(*s.DrainSeconds) {
		t.Errorf("Go defaults disagree with the API server's")
	}
}

func TestProxyPoolRecycleWindowDefaultsToAnHour(t *testing.T) {
	ns := env.Namespace(t)
	c := ctx(t)
	if err := env.Client.Create(c, rawPool(t, ns, "recycling", `{"recycle":{"bannedSites":5},`+minimalTemplate+`}`)); err != nil {
		t.Fatalf("create: %v", err)
	}
	var got v1alpha1.ProxyPool
	if err := env.Client.Get(c, client.ObjectKey{Namespace: ns, Name: "recycling"}, &got); err != nil {
		t.Fatalf("get: %v", err)
	}
	if r := got.Spec.Recycle; r == nil || r.BannedSites != 5 || r.Window == nil || r.Window.Duration != v1alpha1.DefaultRecycleWindow {
		t.Fatalf("recycle = %+v, want 5 sites within the default %s", r, v1alpha1.DefaultRecycleWindow)
	}
	if w := (&v1alpha1.ProxyPool{Spec: v1alpha1.ProxyPoolSpec{Recycle: &v1alpha1.PoolRecycle{BannedSites: 5}}}).RecycleWindow(); w != v1alpha1.DefaultRecycleWindow {
		t.Errorf("Go default of the window %s, the API server's %s", w, v1alpha1.DefaultRecycleWindow)
	}
	if w := (&v1alpha1.ProxyPool{}).RecycleWindow(); w != 0 {
		t.Errorf("RecycleWindow without spec.recycle = %s, want 0 (off)", w)
	}
}

func TestProxyPoolTemplateModeAndProviderAreEditable(t *testing.T) {
	// The Proxy's mode and provider are immutable, but the same fields in a
	// pool's template are not: a pool rolls to new Proxies instead.
	ns := env.Namespace(t)
	c := ctx(t)
	if err := env.Client.Create(c, rawPool(t, ns, "movable", `{`+minimalTemplate+`}`)); err != nil {
		t.Fatalf("create: %v", err)
	}
	var p v1alpha1.ProxyPool
	if err := env.Client.Get(c, client.ObjectKey{Namespace: ns, Name: "movable"}, &p); err != nil {
		t.Fatalf("get: %v", err)
	}
	p.Spec.Template.Spec.Provider = "gcp-eu"
	if err := env.Client.Update(c, &p); err != nil {
		t.Fatalf("changing the template's provider was refused: %v", err)
	}
	p.Spec.Template.Spec.Mode, p.Spec.Template.Spec.Provider = v1alpha1.ModeExternal, ""
	p.Spec.Template.Spec.Placement = nil
	p.Spec.Template.Spec.Endpoint = &v1alpha1.Endpoint{Host: "127.0.0.1", Port: 3128}
	if err := env.Client.Update(c, &p); err != nil {
		t.Fatalf("changing the template's mode was refused: %v", err)
	}
}

func TestProxyPoolScaleSubresource(t *testing.T) {
	ns := env.Namespace(t)
	c := ctx(t)
	if err := env.Client.Create(c, rawPool(t, ns, "eu", `{"replicas":2,`+minimalTemplate+`}`)); err != nil {
		t.Fatalf("create: %v", err)
	}
	var p v1alpha1.ProxyPool
	if err := env.Client.Get(c, client.ObjectKey{Namespace: ns, Name: "eu"}, &p); err != nil {
		t.Fatalf("get: %v", err)
	}
	// The status the controller writes is what /scale reports.
	p.Status = v1alpha1.ProxyPoolStatus{Replicas: 2, ReadyReplicas: 1, Selector: p.Selector()}
	if err := env.Client.Status().Update(c, &p); err != nil {
		t.Fatalf("status update: %v", err)
	}

	sc, err := env.ScaleClient()
	if err != nil {
		t.Fatal(err)
	}
	gr := schema.GroupResource{Group: v1alpha1.Group, Resource: "proxypools"}
	s, err := sc.Scales(ns).Get(c, gr, "eu", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("GET /scale: %v", err)
	}
	if s.Spec.Replicas != 2 || s.Status.Replicas != 2 || s.Status.Selector != v1alpha1.LabelPool+"=eu" {
		t.Errorf("scale = spec %d, status %d, selector %q; want 2, 2, %s=eu", s.Spec.Replicas, s.Status.Replicas, s.Status.Selector, v1alpha1.LabelPool)
	}

	// kubectl scale pxp/eu --replicas=5
	s.Spec.Replicas = 5
	if _, err := sc.Scales(ns).Update(c, gr, s, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("PUT /scale: %v", err)
	}
	if err := env.Client.Get(c, client.ObjectKey{Namespace: ns, Name: "eu"}, &p); err != nil {
		t.Fatalf("get: %v", err)
	}
	if p.Spec.Replicas == nil || *p.Spec.Replicas != 5 {
		t.Errorf("spec.replicas = %v after scaling to 5", p.Spec.Replicas)
	}

	t.Run("the scale subresource validates replicas as the spec does", func(t *testing.T) {
		bad := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: "eu", Namespace: ns}, Spec: autoscalingv1.ScaleSpec{Replicas: -3}}
		_, err := sc.Scales(ns).Update(c, gr, bad, metav1.UpdateOptions{})
		if err == nil || !strings.Contains(err.Error(), "spec.replicas") {
			t.Errorf("scaling to -3: got %v, want an error naming spec.replicas", err)
		}
	})
}

func TestProxyPoolDiscoveryAndPrinterColumns(t *testing.T) {
	ns := env.Namespace(t)
	c := ctx(t)
	if err := env.Client.Create(c, rawPool(t, ns, "cols", `{"replicas":3,`+minimalTemplate+`}`)); err != nil {
		t.Fatalf("create: %v", err)
	}
	var p v1alpha1.ProxyPool
	if err := env.Client.Get(c, client.ObjectKey{Namespace: ns, Name: "cols"}, &p); err != nil {
		t.Fatalf("get: %v", err)
	}
	p.Status = v1alpha1.ProxyPoolStatus{Replicas: 3, ReadyReplicas: 2, Selector: p.Selector()}
	if err := env.Client.Status().Update(c, &p); err != nil {
		t.Fatalf("status update: %v", err)
	}

	tb := table(t, "/apis/proxyfleet.io/v1alpha1/namespaces/"+ns+"/proxypools")
	want := []string{"Name", "Desired", "Current", "Ready", "Age"}
	if got := columns(tb); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("kubectl get pxp columns = %v, want %v", got, want)
	}
	if len(tb.Rows) != 1 {
		t.Fatalf("rows = %d, want 1", len(tb.Rows))
	}
	if cells := tb.Rows[0].Cells; cells[0] != "cols" || cells[1] != float64(3) || cells[2] != float64(3) || cells[3] != float64(2) {
		t.Errorf("row = %v, want [cols 3 3 2 <age>]", cells)
	}
}
