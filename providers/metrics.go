package providers

import "context"

// Operation names of provider_requests_total{op}.
const (
	OpCreate = "create"
	OpGet    = "get"
	OpDelete = "delete"
	OpList   = "list"
)

// RequestRecorder receives one call per provider request; a metrics package
// satisfies it structurally and exposes provider_requests_total{provider,op,result}.
// result is ok, transient, permanent, quota_exceeded or not_found (ResultLabel).
type RequestRecorder interface {
	ProviderRequest(provider, op, result string)
}

// WithMetrics wraps p so every Create, Get, Delete and ListByTag is recorded
// under the entry name. The wrapper implements Checker exactly when p does, and
// Check calls pass through unrecorded: a health check is not a provider request.
func WithMetrics(p Provider, name string, rec RequestRecorder) Provider {
	m := &metricsProvider{next: p, name: name, rec: rec}
	if c, ok := p.(Checker); ok {
		return &metricsChecker{metricsProvider: m, checker: c}
	}
	return m
}

// Unwrapper is implemented by decorators; Unwrap returns the wrapped provider.
type Unwrapper interface {
	Unwrap() Provider
}

type metricsProvider struct {
	next Provider
	name string
	rec  RequestRecorder
}

func (m *metricsProvider) record(op string, err error) {
	m.rec.ProviderRequest(m.name, op, ResultLabel(err))
}

func (m *metricsProvider) Create(ctx context.Context, req CreateRequest) (Instance, error) {
	inst, err := m.next.Create(ctx, req)
	m.record(OpCreate, err)
	return inst, err
}

func (m *metricsProvider) Get(ctx context.Context, providerID string) (Instance, error) {
	inst, err := m.next.Get(ctx, providerID)
	m.record(OpGet, err)
	return inst, err
}

func (m *metricsProvider) Delete(ctx context.Context, providerID string) error {
	err := m.next.Delete(ctx, providerID)
	m.record(OpDelete, err)
	return err
}

func (m *metricsProvider) ListByTag(ctx context.Context) ([]Instance, error) {
	list, err := m.next.ListByTag(ctx)
	m.record(OpList, err)
	return list, err
}

func (m *metricsProvider) Unwrap() Provider { return m.next }

type metricsChecker struct {
	*metricsProvider
	checker Checker
}

func (m *metricsChecker) Check(ctx context.Context) []TargetStatus { return m.checker.Check(ctx) }
