package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/health"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// env is the package's one real API server (kube-apiserver + etcd).
var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

const (
	// wait is the deadline for anything the controller should do: generous,
	// because envtest on a busy 2-core box is slow.
	wait = 30 * time.Second
	// fakeName is the provider name the test double is configured under.
	fakeName = "fake"
)

// fastIntervals shrink every requeue delay so a test sees many passes.
func fastIntervals() Intervals {
	return Intervals{
		RequeueNow:       20 * time.Millisecond,
		ProvisioningPoll: 100 * time.Millisecond,
		DeletionPoll:     100 * time.Millisecond,
		DriftPoll:        150 * time.Millisecond,
		QuotaRetry:       time.Hour,
	}
}

// harness is one running manager with the Proxy reconciler, restricted to a
// namespace of its own, talking to the shared real API server.
type harness struct {
	t        *testing.T
	ns       string
	fake     *providertest.Provider
	r        *ProxyReconciler
	client   *countingClient
	logs     *logRecorder
	stopOnce func()
}

// setup configures a harness before it starts.
type setup struct {
	providers    map[string]providers.Provider // nil map: no providers config
	noProviders  bool
	intervals    *Intervals
	maxParallel  int // MaxConcurrentReconciles; 0 means the reconciler's default
	healthEvents <-chan event.GenericEvent
	health       HealthSource
	beforeStart  func(h *harness) // runs after the namespace exists, before the manager starts
	// engine, when set, also runs the real health engine (SetupHealthEngine)
	// with these options; Tick defaults to healthTick.
	engine *health.Options
	// onManager runs after the Proxy reconciler is configured, before the
	// manager starts: more reconcilers and runnables go on mgr here.
	onManager func(h *harness, mgr manager.Manager)
}

// start runs a manager for the test and stops it when the test ends.
func start(t *testing.T, s setup) *harness {
	t.Helper()
	h := &harness{t: t, ns: env.Namespace(t), fake: providertest.New(), logs: &logRecorder{}}
	provs := s.providers
	if provs == nil && !s.noProviders {
		provs = map[string]providers.Provider{fakeName: h.fake}
	}
	iv := fastIntervals()
	if s.intervals != nil {
		iv = *s.intervals
	}
	if s.beforeStart != nil {
		s.beforeStart(h)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("provider calls: %s", h.fake)
			t.Logf("controller log:\n%s", h.logs.dump())
		}
	})
	mgr, err := NewManager(env.Config, ManagerOptions{
		ProxyNamespace: h.ns,
		MetricsAddr:    "0",
		Logger:         logr.New(&recordingSink{rec: h.logs}),
	})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	h.client = &countingClient{Client: mgr.GetClient()}
	h.r = &ProxyReconciler{
		Client:                  h.client,
		Providers:               provs,
		Installation:            testInstallation,
		Intervals:               iv,
		MaxConcurrentReconciles: s.maxParallel,
		HealthEvents:            s.healthEvents,
		Health:                  s.health,
		SkipNameValidation:      true,
	}
	if s.engine != nil {
		o := *s.engine
		if o.Tick == 0 {
			o.Tick = healthTick
		}
		if _, err := SetupHealthEngine(mgr, h.r, o); err != nil {
			t.Fatalf("SetupHealthEngine: %v", err)
		}
	}
	if s.onManager != nil {
		s.onManager(h, mgr)
	}
	h.run(mgr)
	return h
}

// run sets h.r up on mgr, starts mgr and waits for its cache. The manager
// stops when the test ends, or earlier through h.stopOnce.
func (h *harness) run(mgr manager.Manager) {
	t := h.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := h.r.SetupWithManager(ctx, mgr); err != nil {
		cancel()
		t.Fatalf("SetupWithManager: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	h.stopOnce = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("manager: %v", err)
				}
			case <-time.After(wait):
				t.Errorf("manager did not stop within %s", wait)
			}
		})
	}
	t.Cleanup(h.stopOnce)
	syncCtx, syncCancel := context.WithTimeout(ctx, wait)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatalf("manager cache did not sync within %s", wait)
	}
}

// ctx is a context for one API call from the test.
func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	h.t.Cleanup(cancel)
	return ctx
}

// managed returns a Managed Proxy on the test double.
// testInstallation is the installation ID of the reconcilers these tests
// start.
const testInstallation = "test-installation"

func (h *harness) managed(name string) *v1alpha1.Proxy {
	return gen.Proxy(name, gen.SetProxyNamespace(h.ns), gen.SetProxyManaged(fakeName),
		gen.SetProxyPlacement(v1alpha1.Placement{Zone: "zone-a", MachineType: "small", Image: "squid"}))
}

func (h *harness) create(obj client.Object) {
	h.t.Helper()
	if err := env.Client.Create(h.ctx(), obj); err != nil {
		h.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// get reads a Proxy straight from the API server.
func (h *harness) get(name string) (*v1alpha1.Proxy, error) {
	var p v1alpha1.Proxy
	err := env.Client.Get(h.ctx(), types.NamespacedName{Namespace: h.ns, Name: name}, &p)
	return &p, err
}

func (h *harness) mustGet(name string) *v1alpha1.Proxy {
	h.t.Helper()
	p, err := h.get(name)
	if err != nil {
		h.t.Fatalf("get Proxy %s: %v", name, err)
	}
	return p
}

// edit applies fn to the latest Proxy and updates it, retrying conflicts
// (the controller writes the same object).
func (h *harness) edit(name string, fn func(p *v1alpha1.Proxy)) {
	h.t.Helper()
	poll.Until(h.t, wait, "update Proxy "+name, func() error {
		p, err := h.get(name)
		if err != nil {
			return err
		}
		fn(p)
		if err := env.Client.Update(h.ctx(), p); err != nil {
			return err
		}
		return nil
	})
}

// waitProxy waits until the Proxy satisfies cond and returns it.
func (h *harness) waitProxy(name, what string, cond func(p *v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	h.t.Helper()
	var got *v1alpha1.Proxy
	poll.Until(h.t, wait, name+": "+what, func() error {
		p, err := h.get(name)
		if err != nil {
			return err
		}
		got = p
		return poll.Check(cond(p), "%s", describe(p))
	})
	return got
}

// waitGone waits until the Proxy no longer exists.
func (h *harness) waitGone(name string) {
	h.t.Helper()
	poll.Until(h.t, wait, name+" deleted", func() error {
		p, err := h.get(name)
		if err == nil {
			return errors.New(describe(p))
		}
		return poll.Check(client.IgnoreNotFound(err) == nil, "%s", err.Error())
	})
}

// waitRunning waits for the Proxy to have an address and Provisioned=True.
func (h *harness) waitRunning(name string) *v1alpha1.Proxy {
	h.t.Helper()
	return h.waitProxy(name, "running", func(p *v1alpha1.Proxy) bool {
		return p.Status.IP != "" && meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionProvisioned)
	})
}

// reason returns the Provisioned condition's reason, or "".
func reason(p *v1alpha1.Proxy) string {
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned); c != nil {
		return c.Reason
	}
	return ""
}

// message returns the Provisioned condition's message, or "".
func message(p *v1alpha1.Proxy) string {
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned); c != nil {
		return c.Message
	}
	return ""
}

// describe summarises a Proxy for failure messages.
func describe(p *v1alpha1.Proxy) string {
	var conds []string
	for _, c := range p.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s/%s(%q, gen %d)", c.Type, c.Status, c.Reason, c.Message, c.ObservedGeneration))
	}
	return fmt.Sprintf("phase=%s ip=%q providerID=%q gen=%d observed=%d finalizers=%v annotations=%v deleting=%v conditions=[%s]",
		p.Status.Phase, p.Status.IP, p.Status.ProviderID, p.Generation, p.Status.ObservedGeneration,
		p.Finalizers, p.Annotations, !p.DeletionTimestamp.IsZero(), strings.Join(conds, " "))
}

// countingClient counts writes to the status subresource: the "no status
// write when nothing changed" rule is about exactly these calls.
type countingClient struct {
	client.Client
	statusWrites atomic.Int64
}

func (c *countingClient) Status() client.SubResourceWriter {
	return &countingStatusWriter{SubResourceWriter: c.Client.Status(), n: &c.statusWrites}
}

type countingStatusWriter struct {
	client.SubResourceWriter
	n *atomic.Int64
}

func (w *countingStatusWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	w.n.Add(1)
	return w.SubResourceWriter.Update(ctx, obj, opts...)
}

func (w *countingStatusWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	w.n.Add(1)
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// logRecorder keeps every line the manager logs, so tests can assert on
// error logs and dump the log when they fail.
type logRecorder struct {
	mu     sync.Mutex
	lines  []string
	errors []string
}

func (l *logRecorder) add(isErr bool, line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	if isErr {
		l.errors = append(l.errors, line)
	}
}

// errorLines returns the lines logged at error level.
func (l *logRecorder) errorLines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errors...)
}

func (l *logRecorder) dump() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// recordingSink is a logr.LogSink writing into a logRecorder.
type recordingSink struct {
	rec    *logRecorder
	name   string
	values []any
}

func (s *recordingSink) Init(logr.RuntimeInfo)  {}
func (s *recordingSink) Enabled(level int) bool { return level <= 1 }
func (s *recordingSink) Info(level int, msg string, kv ...any) {
	s.rec.add(false, fmt.Sprintf("%s INFO %s %v %v", s.name, msg, s.values, kv))
}
func (s *recordingSink) Error(err error, msg string, kv ...any) {
	s.rec.add(true, fmt.Sprintf("%s ERROR %s: %v %v %v", s.name, msg, err, s.values, kv))
}
func (s *recordingSink) WithValues(kv ...any) logr.LogSink {
	c := *s
	c.values = append(append([]any(nil), s.values...), kv...)
	return &c
}
func (s *recordingSink) WithName(name string) logr.LogSink {
	c := *s
	if c.name != "" {
		name = c.name + "/" + name
	}
	c.name = name
	return &c
}

// reqFor is the reconcile request for a Proxy.
func reqFor(p *v1alpha1.Proxy) reconcile.Request {
	return reconcile.Request{NamespacedName: client.ObjectKeyFromObject(p)}
}

// fakeHealth is a HealthSource test double standing in for the health
// engine: verdicts are set by the test.
type fakeHealth struct {
	mu    sync.Mutex
	snaps map[types.NamespacedName]HealthSnapshot
}

func (f *fakeHealth) set(key types.NamespacedName, s HealthSnapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.snaps == nil {
		f.snaps = map[types.NamespacedName]HealthSnapshot{}
	}
	f.snaps[key] = s
}

func (f *fakeHealth) Snapshot(key types.NamespacedName) (HealthSnapshot, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.snaps[key]
	return s, ok
}
