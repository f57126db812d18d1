package v1alpha1

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestEffectiveAddress(t *testing.T) {
	tests := []struct {
		name     string
		proxy    Proxy
		external bool
		host     string
		port     int32
		address  string
	}{
		{
			name:    "managed proxy without an observed IP has no address yet",
			proxy:   Proxy{Spec: ProxySpec{Mode: ModeManaged, Provider: "p", Port: 3128}},
			host:    "",
			port:    3128,
			address: "",
		},
		{
			name:    "managed proxy dials status.ip on spec.port",
			proxy:   Proxy{Spec: ProxySpec{Mode: ModeManaged, Provider: "p", Port: 8080}, Status: ProxyStatus{IP: "10.1.2.3"}},
			host:    "10.1.2.3",
			port:    8080,
			address: "10.1.2.3:8080",
		},
		{
			name:    "empty mode is managed and an unset port is the default",
			proxy:   Proxy{Spec: ProxySpec{Provider: "p"}, Status: ProxyStatus{IP: "10.1.2.3"}},
			host:    "10.1.2.3",
			port:    DefaultPort,
			address: "10.1.2.3:3128",
		},
		{
			name:     "external proxy dials the endpoint, ignoring spec.port and status.ip",
			proxy:    Proxy{Spec: ProxySpec{Mode: ModeExternal, Port: 3128, Endpoint: &Endpoint{Host: "squid.example", Port: 3130}}, Status: ProxyStatus{IP: "192.0.2.9"}},
			external: true,
			host:     "squid.example",
			port:     3130,
			address:  "squid.example:3130",
		},
		{
			name:     "external proxy without endpoint has no address",
			proxy:    Proxy{Spec: ProxySpec{Mode: ModeExternal}},
			external: true,
		},
		{
			name:     "IPv6 hosts are bracketed",
			proxy:    Proxy{Spec: ProxySpec{Mode: ModeExternal, Endpoint: &Endpoint{Host: "::1", Port: 3128}}},
			external: true,
			host:     "::1",
			port:     3128,
			address:  "[::1]:3128",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.proxy.IsExternal(); got != tc.external {
				t.Errorf("IsExternal() = %v, want %v", got, tc.external)
			}
			if got := tc.proxy.EffectiveHost(); got != tc.host {
				t.Errorf("EffectiveHost() = %q, want %q", got, tc.host)
			}
			if got := tc.proxy.EffectivePort(); got != tc.port {
				t.Errorf("EffectivePort() = %d, want %d", got, tc.port)
			}
			if got := tc.proxy.Address(); got != tc.address {
				t.Errorf("Address() = %q, want %q", got, tc.address)
			}
		})
	}
}

func TestSkipCleanup(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		want        bool
	}{
		{"no annotations means clean up", nil, false},
		{"annotation true skips cleanup", map[string]string{AnnotationSkipCleanup: "true"}, true},
		{"any other value still cleans up", map[string]string{AnnotationSkipCleanup: "yes"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Proxy{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations}}
			if got := p.SkipCleanup(); got != tc.want {
				t.Errorf("SkipCleanup() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestIsHealthy(t *testing.T) {
	tests := []struct {
		name       string
		conditions []metav1.Condition
		want       bool
	}{
		{"no conditions is not healthy", nil, false},
		{"Healthy=True is healthy", []metav1.Condition{{Type: ConditionHealthy, Status: metav1.ConditionTrue}}, true},
		{"Healthy=False is not healthy", []metav1.Condition{{Type: ConditionHealthy, Status: metav1.ConditionFalse}}, false},
		{"Provisioned=True alone is not healthy", []metav1.Condition{{Type: ConditionProvisioned, Status: metav1.ConditionTrue}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Proxy{Status: ProxyStatus{Conditions: tc.conditions}}
			if got := p.IsHealthy(); got != tc.want {
				t.Errorf("IsHealthy() = %v, want %v", got, tc.want)
			}
		})
	}
	p := Proxy{Status: ProxyStatus{Conditions: []metav1.Condition{{Type: ConditionProvisioned, Reason: ReasonCreated}}}}
	if c := p.Condition(ConditionProvisioned); c == nil || c.Reason != ReasonCreated {
		t.Errorf("Condition(Provisioned) = %+v, want reason %s", c, ReasonCreated)
	}
	if c := p.Condition(ConditionHealthy); c != nil {
		t.Errorf("Condition(Healthy) = %+v, want nil", c)
	}
}

func TestSecretKeyDefaultsToUserData(t *testing.T) {
	if got := (&SecretKeyRef{Name: "s"}).SecretKey(); got != "user-data" {
		t.Errorf("SecretKey() with no key = %q, want user-data", got)
	}
	if got := (&SecretKeyRef{Name: "s", Key: "cloud-config"}).SecretKey(); got != "cloud-config" {
		t.Errorf("SecretKey() = %q, want cloud-config", got)
	}
}

func TestHealthCheckWithDefaults(t *testing.T) {
	tests := []struct {
		name     string
		in       HealthCheck
		want     HealthCheck
		interval time.Duration
		timeout  time.Duration
	}{
		{
			name:     "zero health check takes every default",
			in:       HealthCheck{},
			want:     HealthCheck{IntervalSeconds: 10, TimeoutSeconds: 5, SuccessThreshold: 1, FailureThreshold: 3, ExpectedStatus: 200},
			interval: 10 * time.Second,
			timeout:  5 * time.Second,
		},
		{
			name:     "set fields are kept",
			in:       HealthCheck{URL: "http://127.0.0.1/", IntervalSeconds: 2, TimeoutSeconds: 1, SuccessThreshold: 2, FailureThreshold: 5, ExpectedStatus: 204},
			want:     HealthCheck{URL: "http://127.0.0.1/", IntervalSeconds: 2, TimeoutSeconds: 1, SuccessThreshold: 2, FailureThreshold: 5, ExpectedStatus: 204},
			interval: 2 * time.Second,
			timeout:  time.Second,
		},
		{
			name:     "an unset timeout is the interval when that is shorter than 5s",
			in:       HealthCheck{IntervalSeconds: 2},
			want:     HealthCheck{IntervalSeconds: 2, TimeoutSeconds: 2, SuccessThreshold: 1, FailureThreshold: 3, ExpectedStatus: 200},
			interval: 2 * time.Second,
			timeout:  2 * time.Second,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.in.WithDefaults(); got != tc.want {
				t.Errorf("WithDefaults() = %+v, want %+v", got, tc.want)
			}
			if got := tc.in.Interval(); got != tc.interval {
				t.Errorf("Interval() = %v, want %v", got, tc.interval)
			}
			if got := tc.in.Timeout(); got != tc.timeout {
				t.Errorf("Timeout() = %v, want %v", got, tc.timeout)
			}
		})
	}
}

func TestDeepCopyIsIndependent(t *testing.T) {
	orig := &Proxy{Spec: ProxySpec{
		Attributes: map[string]string{"region": "eu"},
		CloudInit:  &CloudInit{SecretRef: &SecretKeyRef{Name: "a"}},
	}}
	cp := orig.DeepCopy()
	cp.Spec.Attributes["region"] = "us"
	cp.Spec.CloudInit.SecretRef.Name = "b"
	if orig.Spec.Attributes["region"] != "eu" || orig.Spec.CloudInit.SecretRef.Name != "a" {
		t.Errorf("DeepCopy shares memory with the original: %+v", orig.Spec)
	}
}
