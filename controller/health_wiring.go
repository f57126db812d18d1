package controller

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/controller/health"
)

// SetupHealthEngine creates the health engine over the manager's cache, adds
// it to mgr (it runs on the leader only) and connects it to r: the engine's
// events re-enqueue Proxies through a channel source, and r stages the
// engine's verdicts into status. Call it before r.SetupWithManager. A nil
// o.Reader means mgr.GetCache(), a nil o.Credentials the manager's
// credentials cache (NewManager), so probes log in with the Proxies' logins.
func SetupHealthEngine(mgr ctrl.Manager, r *ProxyReconciler, o health.Options) (*health.Engine, error) {
	if o.Reader == nil {
		o.Reader = mgr.GetCache()
	}
	if o.Credentials == nil {
		if c := CredentialsCacheOf(mgr); c != nil {
			o.Credentials = c
		} else {
			return nil, errors.New("the health engine needs the credentials Secret cache: build the manager with controller.NewManager or set Options.Credentials")
		}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = mgr.GetLogger().WithName("health")
	}
	e, err := health.New(o)
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(e); err != nil {
		return nil, fmt.Errorf("adding the health engine to the manager: %w", err)
	}
	r.HealthEvents = e.Events()
	r.Health = engineHealth{Engine: e}
	return e, nil
}

// engineHealth adapts the health engine to the reconciler's HealthSource.
type engineHealth struct {
	// Engine is the running health engine.
	Engine *health.Engine
}

// Snapshot converts the engine's reported verdict. A Proxy the engine tracks
// without a verdict (never probed, no probe URL, a new address) becomes
// NoVerdict, which removes a stale Healthy condition; one it does not track
// (not started yet, or no address) leaves status alone.
func (h engineHealth) Snapshot(key types.NamespacedName) (HealthSnapshot, bool) {
	v, ok := h.Engine.Snapshot(key)
	if !ok {
		return HealthSnapshot{}, false
	}
	if !v.Known {
		return HealthSnapshot{NoVerdict: true}, true
	}
	return HealthSnapshot{
		Healthy:       v.Healthy,
		Message:       v.Message,
		LatencyMillis: latencyMillis(v.Latency),
		CheckedAt:     v.CheckedAt,
	}, true
}

// latencyMillis rounds up, so a healthy proxy answering in under a
// millisecond shows 1 rather than an absent (zero) latency.
func latencyMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
