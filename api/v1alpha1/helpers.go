package v1alpha1

import (
	"net"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IsExternal reports whether the proxy already runs at spec.endpoint and is
// never provisioned. An empty mode is Managed, the API default.
func (p *Proxy) IsExternal() bool {
	return p.Spec.Mode == ModeExternal
}

// EffectiveHost is the host clients dial: the endpoint host for External,
// the observed instance IP (status.ip) for Managed; empty while unknown.
func (p *Proxy) EffectiveHost() string {
	if p.IsExternal() {
		if p.Spec.Endpoint == nil {
			return ""
		}
		return p.Spec.Endpoint.Host
	}
	return p.Status.IP
}

// EffectivePort is the port clients dial: the endpoint port for External,
// spec.port (DefaultPort when unset) for Managed; 0 for an External proxy
// without an endpoint.
func (p *Proxy) EffectivePort() int32 {
	if p.IsExternal() {
		if p.Spec.Endpoint == nil {
			return 0
		}
		return p.Spec.Endpoint.Port
	}
	if p.Spec.Port == 0 {
		return DefaultPort
	}
	return p.Spec.Port
}

// Address is "host:port" of the proxy (IPv6 hosts bracketed), or "" while
// the host or port is unknown.
func (p *Proxy) Address() string {
	host, port := p.EffectiveHost(), p.EffectivePort()
	if host == "" || port == 0 {
		return ""
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// SkipCleanup reports whether the proxyfleet.io/skip-cleanup annotation asks
// the controller to release the object without deleting its instance.
func (p *Proxy) SkipCleanup() bool {
	return p.Annotations[AnnotationSkipCleanup] == ValueTrue
}

// IsHealthy reports whether the Healthy condition is True: the only Proxies
// the pool offers.
func (p *Proxy) IsHealthy() bool {
	return meta.IsStatusConditionTrue(p.Status.Conditions, ConditionHealthy)
}

// Condition returns the condition of type t, or nil.
func (p *Proxy) Condition(t string) *metav1.Condition {
	return meta.FindStatusCondition(p.Status.Conditions, t)
}

// SecretKey is the Secret key holding the user-data: secretRef.key, or
// DefaultCloudInitSecretKey when unset.
func (r *SecretKeyRef) SecretKey() string {
	if r.Key == "" {
		return DefaultCloudInitSecretKey
	}
	return r.Key
}

// WithDefaults returns h with every zero field set to the API default, for
// objects that did not pass through the API server's defaulting.
func (h HealthCheck) WithDefaults() HealthCheck {
	if h.IntervalSeconds == 0 {
		h.IntervalSeconds = DefaultHealthCheckIntervalSeconds
	}
	if h.TimeoutSeconds == 0 {
		h.TimeoutSeconds = min(DefaultHealthCheckTimeoutSeconds, h.IntervalSeconds)
	}
	if h.SuccessThreshold == 0 {
		h.SuccessThreshold = DefaultHealthCheckSuccessThreshold
	}
	if h.FailureThreshold == 0 {
		h.FailureThreshold = DefaultHealthCheckFailureThreshold
	}
	if h.ExpectedStatus == 0 {
		h.ExpectedStatus = DefaultHealthCheckExpectedStatus
	}
	return h
}

// Interval is the time between probes, defaulted.
func (h HealthCheck) Interval() time.Duration {
	return time.Duration(h.WithDefaults().IntervalSeconds) * time.Second
}

// Timeout bounds one probe, defaulted.
func (h HealthCheck) Timeout() time.Duration {
	return time.Duration(h.WithDefaults().TimeoutSeconds) * time.Second
}

// EffectiveScheme is the scheme the proxy is spoken to with: the External
// endpoint's scheme, "http" when unset and for every Managed proxy.
func (p *Proxy) EffectiveScheme() string {
	if p.IsExternal() && p.Spec.Endpoint != nil && p.Spec.Endpoint.Scheme != "" {
		return p.Spec.Endpoint.Scheme
	}
	return SchemeHTTP
}

// CredentialsSecretName is the Secret an External proxy's login is read
// from (spec.endpoint.credentialsSecretRef), "" when it names none.
func (p *Proxy) CredentialsSecretName() string {
	if !p.IsExternal() || p.Spec.Endpoint == nil || p.Spec.Endpoint.CredentialsSecretRef == nil {
		return ""
	}
	return p.Spec.Endpoint.CredentialsSecretRef.Name
}
