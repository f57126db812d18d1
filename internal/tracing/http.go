package tracing

// HealthzPath is the liveness path the lease API serves; its requests
// get no span (a probe every few seconds would drown the traces).
const HealthzPath = "/healthz"
