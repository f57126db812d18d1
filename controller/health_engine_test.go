package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/internal/testkit/squid"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// These tests run the real health engine, wired by SetupHealthEngine, with
// the real reconciler against the real API server, probing real Squids.

// healthTick shrinks the engine's tick so a 1s probe interval (the CRD
// minimum) is kept to within a tenth of a second.
const healthTick = 100 * time.Millisecond

// engineHarness is a harness whose manager also runs the health engine.
type engineHarness struct {
	*harness
	engine  *health.Engine
	metrics *probeRecorder
}

// startWithEngine runs a manager with the reconciler and the health engine in
// namespace ns ("" = a fresh one). o's Reader, Tick and Metrics are filled in.
func startWithEngine(t *testing.T, ns string, o health.Options) *engineHarness {
	t.Helper()
	if ns == "" {
		ns = env.Namespace(t)
	}
	h := &harness{t: t, ns: ns, fake: providertest.New(), logs: &logRecorder{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller log:\n%s", h.logs.dump())
		}
	})
	mgr, err := NewManager(env.Config, ManagerOptions{
		ProxyNamespace: ns,
		MetricsAddr:    "0",
		Logger:         logr.New(&recordingSink{rec: h.logs}),
	})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	h.client = &countingClient{Client: mgr.GetClient()}
	h.r = &ProxyReconciler{
		Client:             h.client,
		Providers:          map[string]providers.Provider{fakeName: h.fake},
		Installation:       testInstallation,
		Intervals:          fastIntervals(),
		SkipNameValidation: true,
	}
	rec := &probeRecorder{}
	if o.Tick == 0 {
		o.Tick = healthTick
	}
	o.Metrics = rec
	e, err := SetupHealthEngine(mgr, h.r, o)
	if err != nil {
		t.Fatalf("SetupHealthEngine: %v", err)
	}
	h.run(mgr)
	return &engineHarness{harness: h, engine: e, metrics: rec}
}

// external is an External Proxy at squid, probing target every second.
func (h *engineHarness) external(name string, sq *squid.Squid, target string, failureThreshold int32) *v1alpha1.Proxy {
	return gen.Proxy(name, gen.SetProxyNamespace(h.ns), gen.SetProxyEndpoint("127.0.0.1", int32(sq.Port())),
		gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: target, IntervalSeconds: 1, TimeoutSeconds: 1, FailureThreshold: failureThreshold}))
}

// waitReady waits for phase Ready with the full health representation.
func (h *engineHarness) waitReady(name string) *v1alpha1.Proxy {
	h.t.Helper()
	return h.waitProxy(name, "Ready with Healthy=True, a latency and a check time", func(p *v1alpha1.Proxy) bool {
		c := p.Condition(v1alpha1.ConditionHealthy)
		return p.Status.Phase == v1alpha1.PhaseReady && c != nil && c.Status == metav1.ConditionTrue &&
			c.Reason == v1alpha1.ReasonProbeSucceeded && p.Status.LatencyMillis > 0 && p.Status.LastHealthCheckTime != nil
	})
}

func TestHealthEngineTurnsAProxyReadyUnhealthyAndReadyAgain(t *testing.T) {
	t.Parallel()
	sq := squid.Start(t, squid.Options{Name: "health-flip", OutgoingAddr: "127.0.0.21"})
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	h := startWithEngine(t, "", health.Options{})
	const failureThreshold = 2
	h.create(h.external("px", sq, target.URL()+"/health", failureThreshold))

	p := h.waitReady("px")
	if target.Count("127.0.0.21") == 0 {
		t.Fatal("Ready, but the target never saw a probe from the Squid's outgoing address")
	}
	if !strings.Contains(p.Condition(v1alpha1.ConditionHealthy).Message, "answered 200") {
		t.Errorf("Healthy message %q, want the probe's answer", p.Condition(v1alpha1.ConditionHealthy).Message)
	}
	if p.Status.LastHealthCheckTime.Time.After(time.Now()) {
		t.Errorf("lastHealthCheckTime %s is in the future", p.Status.LastHealthCheckTime)
	}

	sq.Kill()
	killed := time.Now()
	p = h.waitProxy("px", "Unhealthy after the Squid was killed", func(p *v1alpha1.Proxy) bool {
		c := p.Condition(v1alpha1.ConditionHealthy)
		return p.Status.Phase == v1alpha1.PhaseUnhealthy && c != nil && c.Status == metav1.ConditionFalse &&
			c.Reason == v1alpha1.ReasonProbeFailed
	})
	t.Logf("Unhealthy %s after the kill (failureThreshold %d x interval 1s + tick %s)", time.Since(killed), failureThreshold, healthTick)
	if msg := p.Condition(v1alpha1.ConditionHealthy).Message; !strings.Contains(msg, "refused") {
		t.Errorf("Healthy message %q, want the probe error (connection refused)", msg)
	}
	if p.Status.LatencyMillis != 0 {
		t.Errorf("an unhealthy proxy shows latency %dms", p.Status.LatencyMillis)
	}
	if p.IsHealthy() {
		t.Error("IsHealthy on an Unhealthy proxy")
	}

	sq.Start()
	h.waitReady("px")
	if n := h.metrics.failures(h.ns + "/px"); n < failureThreshold {
		t.Errorf("%d failed probes recorded in metrics, want at least %d", n, failureThreshold)
	}
}

func TestHealthEngineProbesAManagedProxyOnceRunning(t *testing.T) {
	t.Parallel()
	// The test double hands its first instance 127.0.10.1; a real Squid
	// listens there on the port the Proxy names.
	sq := squid.Start(t, squid.Options{Name: "health-managed", ListenIP: "127.0.10.1"})
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	h := startWithEngine(t, "", health.Options{})
	p := h.managed("px")
	p.Spec.Port = int32(sq.Port())
	p.Spec.HealthCheck = v1alpha1.HealthCheck{URL: target.URL() + "/health", IntervalSeconds: 1, TimeoutSeconds: 1}
	h.create(p)
	p = h.waitReady("px")
	if p.Status.IP != "127.0.10.1" {
		t.Fatalf("status.ip %q, want the test double's 127.0.10.1 where the Squid listens", p.Status.IP)
	}
}

func TestSteadyHealthyFleetCausesNoStatusWrites(t *testing.T) {
	t.Parallel()
	squids := squid.StartAll(t,
		squid.Options{Name: "steady-1", OutgoingAddr: "127.0.0.22"},
		squid.Options{Name: "steady-2", OutgoingAddr: "127.0.0.23"},
		squid.Options{Name: "steady-3", OutgoingAddr: "127.0.0.24"},
		squid.Options{Name: "steady-managed", ListenIP: "127.0.10.1"},
	)
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	h := startWithEngine(t, "", health.Options{})
	names := []string{"ext-1", "ext-2", "ext-3", "managed"}
	for i, s := range squids[:3] {
		h.create(h.external(names[i], s, target.URL()+"/health", 3))
	}
	// A Managed Proxy too: its drift polls re-run applyHealth every 150ms.
	m := h.managed("managed")
	m.Spec.Port = int32(squids[3].Port())
	m.Spec.HealthCheck = v1alpha1.HealthCheck{URL: target.URL() + "/health", IntervalSeconds: 1, TimeoutSeconds: 1}
	h.create(m)
	for _, n := range names {
		h.waitReady(n)
	}

	writes := h.client.statusWrites.Load()
	versions := resourceVersions(t, h.harness, names)
	probes := map[string]int{}
	for _, n := range names {
		probes[n] = h.metrics.observed(h.ns + "/" + n)
	}
	// Ten probe intervals, counted in probes rather than slept.
	const intervals = 10
	poll.Until(h.t, wait, fmt.Sprintf("%d more probes of every Proxy", intervals), func() error {
		for _, n := range names {
			if got := h.metrics.observed(h.ns+"/"+n) - probes[n]; got < intervals {
				return fmt.Errorf("%s probed %d more times", n, got)
			}
		}
		return nil
	})
	if got := h.client.statusWrites.Load() - writes; got != 0 {
		t.Errorf("%d status writes over %d probe intervals of a steady healthy fleet, want none", got, intervals)
	}
	for n, rv := range resourceVersions(t, h.harness, names) {
		if rv != versions[n] {
			t.Errorf("%s changed (resourceVersion %s → %s) over %d steady intervals", n, versions[n], rv, intervals)
		}
	}
}

func TestLeaderHandoverKeepsTheHealthyVerdict(t *testing.T) {
	t.Parallel()
	sq := squid.Start(t, squid.Options{Name: "handover", OutgoingAddr: "127.0.0.25"})
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	first := startWithEngine(t, "", health.Options{})
	first.create(first.external("px", sq, target.URL()+"/health", 3))
	before := first.waitReady("px")
	first.stopOnce()

	// A fresh engine, as on a new leader: it must take the verdict from
	// status rather than start from unknown.
	second := startWithEngine(t, first.ns, health.Options{})
	key := types.NamespacedName{Namespace: first.ns, Name: "px"}
	poll.Until(second.t, wait, "the new engine tracks px", func() error {
		_, ok := second.engine.Snapshot(key)
		return poll.Check(ok, "no state yet")
	})
	if v, _ := second.engine.Snapshot(key); !v.Known || !v.Healthy {
		t.Fatalf("the new engine's first view of px is %+v; want the Healthy verdict seeded from status", v)
	}
	const intervals = 5
	poll.Until(second.t, wait, fmt.Sprintf("%d probes by the new engine", intervals), func() error {
		p := second.mustGet("px")
		if c := p.Condition(v1alpha1.ConditionHealthy); c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("the verdict flapped after the handover: %s", describe(p))
		}
		n := second.metrics.observed(key.String())
		return poll.Check(n >= intervals, "%d probes", n)
	})
	after := second.mustGet("px")
	if n := second.client.statusWrites.Load(); n != 0 {
		t.Errorf("the new leader wrote status %d times for an unchanged healthy proxy", n)
	}
	if !after.Condition(v1alpha1.ConditionHealthy).LastTransitionTime.Equal(&before.Condition(v1alpha1.ConditionHealthy).LastTransitionTime) ||
		!after.Status.LastHealthCheckTime.Equal(before.Status.LastHealthCheckTime) {
		t.Errorf("the handover rewrote the health representation:\nbefore %s\nafter  %s", describe(before), describe(after))
	}
}

func TestDeletingAProxyPrunesItsHealthStateAndSeries(t *testing.T) {
	t.Parallel()
	sq := squid.Start(t, squid.Options{Name: "prune"})
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	h := startWithEngine(t, "", health.Options{})
	p := h.external("px", sq, target.URL()+"/health", 3)
	h.create(p)
	h.waitReady("px")
	key := types.NamespacedName{Namespace: h.ns, Name: "px"}
	if !h.metrics.hasSeries(key.String()) {
		t.Fatal("no probe series for a Ready proxy")
	}
	if err := env.Client.Delete(h.ctx(), p); err != nil {
		t.Fatal(err)
	}
	h.waitGone("px")
	poll.Until(h.t, wait, "state and series pruned", func() error {
		_, tracked := h.engine.Snapshot(key)
		series := h.metrics.hasSeries(key.String())
		return poll.Check(!tracked && !series, "tracked=%v series=%v", tracked, series)
	})
}

func TestDefaultProbeURLAndNoProbeURL(t *testing.T) {
	t.Parallel()
	sq := squid.Start(t, squid.Options{Name: "default-url", OutgoingAddr: "127.0.0.26"})
	target := testutil.StartTarget(t, testutil.TargetOptions{})

	t.Run("an empty healthCheck.url probes the default probe URL", func(t *testing.T) {
		h := startWithEngine(t, "", health.Options{DefaultProbeURL: target.URL() + "/default"})
		p := h.external("px", sq, "", 3)
		h.create(p)
		h.waitReady("px")
		seen := false
		for _, r := range target.Requests() {
			seen = seen || (r.Source == "127.0.0.26" && strings.HasSuffix(r.URI, "/default"))
		}
		if !seen {
			t.Error("the target never saw the default probe URL through the Squid")
		}
	})

	t.Run("without any probe URL the proxy has no verdict and a stale one is removed", func(t *testing.T) {
		ns := env.Namespace(t)
		p := gen.Proxy("px", gen.SetProxyNamespace(ns), gen.SetProxyEndpoint("127.0.0.1", int32(sq.Port())),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{IntervalSeconds: 1, TimeoutSeconds: 1}))
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		// A verdict left from when a default probe URL was configured.
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, Message: "stale",
		})
		p.Status.LatencyMillis = 5
		if err := env.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		h := startWithEngine(t, ns, health.Options{})
		got := h.waitProxy("px", "the stale Healthy condition removed", func(p *v1alpha1.Proxy) bool {
			return p.Condition(v1alpha1.ConditionHealthy) == nil && p.Status.LatencyMillis == 0 &&
				meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionProvisioned)
		})
		if got.Status.Phase != v1alpha1.PhaseProvisioning {
			t.Errorf("phase %s, want Provisioning (provisioned, no health verdict)", got.Status.Phase)
		}
		if v, ok := h.engine.Snapshot(client.ObjectKeyFromObject(p)); !ok || v.Known {
			t.Errorf("engine view %+v, %v; want tracked without a verdict", v, ok)
		}
	})
}

// resourceVersions reads the Proxies' resourceVersions from the API server.
func resourceVersions(t *testing.T, h *harness, names []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range names {
		out[n] = h.mustGet(n).ResourceVersion
	}
	return out
}

// probeRecorder is a health.ProbeMetrics that counts observations per proxy
// and drops them on Forget, like the Prometheus vectors do.
type probeRecorder struct {
	mu     sync.Mutex
	probes map[string]int
	failed map[string]int
}

func (r *probeRecorder) ObserveProbe(proxy string, _ time.Duration, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probes == nil {
		r.probes, r.failed = map[string]int{}, map[string]int{}
	}
	r.probes[proxy]++
	if !ok {
		r.failed[proxy]++
	}
}

func (r *probeRecorder) Forget(proxy string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.probes, proxy)
	delete(r.failed, proxy)
}

func (r *probeRecorder) observed(proxy string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.probes[proxy]
}

func (r *probeRecorder) failures(proxy string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed[proxy]
}

func (r *probeRecorder) hasSeries(proxy string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.probes[proxy]
	return ok
}

func TestExternalProxyWithACredentialsSecretIsProbedWithItsLogin(t *testing.T) {
	t.Parallel()
	const pw = "vend0r-pa55word"
	sq := squid.Start(t, squid.Options{Name: "vendor-auth", OutgoingAddr: "127.0.0.25",
		BasicAuth: &squid.Login{Username: "crawler", Password: pw}})
	target := testutil.StartTarget(t, testutil.TargetOptions{})
	h := startWithEngine(t, "", health.Options{})
	p := h.external("vendor", sq, target.URL()+"/health", 1)
	p.Spec.Endpoint.CredentialsSecretRef = &v1alpha1.SecretRef{Name: "vendor-login"}
	h.create(p)

	// No such Secret yet: the reason names the field, nothing is Ready.
	h.waitProxy("vendor", "CredentialsError naming the field", func(p *v1alpha1.Proxy) bool {
		return reason(p) == v1alpha1.ReasonCredentialsError && p.Status.Phase != v1alpha1.PhaseReady &&
			strings.Contains(message(p), "spec.endpoint.credentialsSecretRef: Secret "+h.ns+"/vendor-login not found, or not labelled proxyfleet.io/credentials")
	})

	// Labelled, but the password key is missing: still an error, saying so.
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "vendor-login", Labels: map[string]string{v1alpha1.LabelCredentials: v1alpha1.ValueTrue}},
		Data:       map[string][]byte{"username": []byte("crawler")},
	}
	h.create(s)
	h.waitProxy("vendor", "CredentialsError naming the keys", func(p *v1alpha1.Proxy) bool {
		return reason(p) == v1alpha1.ReasonCredentialsError && strings.Contains(message(p), `needs non-empty keys "username" and "password"`)
	})

	// A wrong password: provisioned, but the Squid refuses it, probe after
	// probe (the Healthy condition changes only on a flip, so the failures
	// are counted in the probe metrics).
	s.Data["password"] = []byte("not-the-" + pw)
	if err := env.Client.Update(h.ctx(), s); err != nil {
		t.Fatal(err)
	}
	h.waitProxy("vendor", "provisioned with the login's Secret", func(p *v1alpha1.Proxy) bool {
		return reason(p) == v1alpha1.ReasonExternalEndpoint
	})
	failed := h.metrics.failures(h.ns + "/vendor")
	poll.Until(h.t, wait, "two more failed probes with the wrong password", func() error {
		n := h.metrics.failures(h.ns + "/vendor")
		return poll.Check(n >= failed+2, "%d failures", n)
	})
	if p := h.mustGet("vendor"); p.Status.Phase == v1alpha1.PhaseReady || target.Count("127.0.0.25") != 0 {
		t.Fatalf("with a wrong password: phase %s, %d probes reached the target; want Unhealthy and none", p.Status.Phase, target.Count("127.0.0.25"))
	}

	// The right one: the next probes log in and the Proxy turns Ready.
	if err := env.Client.Get(h.ctx(), client.ObjectKeyFromObject(s), s); err != nil {
		t.Fatal(err)
	}
	s.Data["password"] = []byte(pw)
	if err := env.Client.Update(h.ctx(), s); err != nil {
		t.Fatal(err)
	}
	p = h.waitReady("vendor")
	if !strings.Contains(message(p), "login from Secret vendor-login") || target.Count("127.0.0.25") == 0 {
		t.Fatalf("Ready with Provisioned %q and %d probes through the Squid; want the Secret named and the probes through it",
			message(p), target.Count("127.0.0.25"))
	}
	if strings.Contains(h.logs.dump(), pw) {
		t.Fatal("the controller logged the proxy password")
	}
}
