package leases

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// env is the package's one real API server (kube-apiserver + etcd).
var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

// wait is the deadline for the source to follow a change: generous for a
// busy 2-core box.
const wait = 30 * time.Second

// logBuffer collects log output safely across goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// countingRecorder counts lease requests by outcome.
type countingRecorder struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *countingRecorder) LeaseRequest(outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[outcome]++
}

func (r *countingRecorder) count(outcome string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[outcome]
}

// running is a manager with only the lease API on it, restricted to the
// test's namespace.
type running struct {
	ns   string
	api  *API
	url  string
	logs *logBuffer
	rec  *countingRecorder
}

func startAPI(t *testing.T, token string) *running {
	t.Helper()
	return startAPIWith(t, token, nil)
}

// startAPIWith is startAPI with edit applied to the Options (nil: none).
func startAPIWith(t *testing.T, token string, edit func(*Options)) *running {
	t.Helper()
	ns := env.Namespace(t)
	return startAPIOn(t, ns, ns, token, edit, nil)
}

// startAPIOn is startAPIWith on a manager whose cache holds the Proxies of
// cacheNS ("": every namespace), with more (nil: nothing) added to the
// manager before it starts; r.ns is ns.
func startAPIOn(t *testing.T, ns, cacheNS, token string, edit func(*Options), more func(ctrl.Manager) error) *running {
	t.Helper()
	r := &running{ns: ns, logs: &logBuffer{}, rec: &countingRecorder{}}
	log := logr.FromSlogHandler(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	mgr, err := controller.NewManager(env.Config, controller.ManagerOptions{
		ProxyNamespace: cacheNS,
		MetricsAddr:    "0",
		Logger:         log,
	})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	if more != nil {
		if err := more(mgr); err != nil {
			t.Fatal(err)
		}
	}
	opts := Options{
		Listen:   "127.0.0.1:0",
		Token:    token,
		Recorder: r.rec,
		Logger:   log,
		Store:    pool.StoreOptions{Cooldown: rotation.CooldownPolicy{Default: time.Hour, Max: 2 * time.Hour}},
	}
	if edit != nil {
		edit(&opts)
	}
	r.api, err = Setup(mgr, opts)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	r.url = "http://" + r.api.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("manager stopped with %v", err)
			}
		case <-time.After(wait):
			t.Error("manager did not stop within 30s")
		}
		if t.Failed() {
			t.Logf("controller log:\n%s", r.logs.String())
		}
	})
	return r
}

// external creates an External Proxy at host:port with attributes.
func (r *running) external(t *testing.T, name, host string, attrs map[string]string) *v1alpha1.Proxy {
	t.Helper()
	p := gen.Proxy(name, gen.SetProxyNamespace(r.ns), gen.SetProxyEndpoint(host, 3128), gen.SetProxyAttributes(attrs))
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatalf("create Proxy %s: %v", name, err)
	}
	return p
}

// setHealthy writes the Healthy condition (and latency) through the status
// subresource, as the reconciler would for the health engine, together with
// status.ip, which the reconciler sets to an External Proxy's endpoint host.
func (r *running) setHealthy(t *testing.T, name string, healthy bool, latencyMillis int64) {
	t.Helper()
	ctx := context.Background()
	var p v1alpha1.Proxy
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	status, reason := metav1.ConditionTrue, v1alpha1.ReasonProbeSucceeded
	if !healthy {
		status, reason = metav1.ConditionFalse, v1alpha1.ReasonProbeFailed
	}
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionHealthy, Status: status, Reason: reason, Message: "set by the test",
		ObservedGeneration: p.Generation,
	})
	p.Status.LatencyMillis = latencyMillis
	p.Status.IP = p.EffectiveHost()
	if err := env.Client.Status().Update(ctx, &p); err != nil {
		t.Fatalf("status update of %s: %v", name, err)
	}
}

func (r *running) client(t *testing.T, token string) *leaseapi.Client {
	t.Helper()
	c, err := leaseapi.NewClient(r.url, token, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// names lists the proxies' names.
func names(ps []leaseapi.ProxyInfo) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

func TestLeaseAPIServesHealthyProxiesFromTheCache(t *testing.T) {
	const token = "lease-t0ken"
	r := startAPI(t, token)
	c := r.client(t, token)
	ctx := context.Background()
	eu1, eu2, us := r.ns+"/eu-1", r.ns+"/eu-2", r.ns+"/us-1"

	r.external(t, "eu-1", "127.0.0.11", map[string]string{"region": "eu", "tier": "dc"})
	r.external(t, "eu-2", "127.0.0.12", map[string]string{"region": "eu", "tier": "res"})
	r.external(t, "us-1", "127.0.0.13", map[string]string{"region": "us", "tier": "dc"})

	t.Run("proxies without a Healthy condition are listed but not offered", func(t *testing.T) {
		poll.Until(t, wait, "every proxy listed, none offered", func() error {
			all, err := c.List(ctx, leaseapi.ListFilter{})
			if err != nil {
				return err
			}
			if got := names(all); !slices.Equal(got, []string{eu1, eu2, us}) {
				return fmt.Errorf("listed %v", got)
			}
			return nil
		})
		healthy, err := c.List(ctx, leaseapi.ListFilter{HealthyOnly: true})
		if err != nil || len(healthy) != 0 {
			t.Fatalf("healthy=true lists %v (%v), want none", names(healthy), err)
		}
		_, err = c.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "eu"}})
		var nm *pool.NoMatchError
		if !errors.As(err, &nm) || nm.Considered != 2 || nm.Unhealthy != 2 {
			t.Fatalf("acquire = %v, want a 409 counting 2 considered, 2 unhealthy", err)
		}
	})

	r.setHealthy(t, "eu-1", true, 42)
	r.setHealthy(t, "us-1", true, 7)

	t.Run("healthy proxies are listed with their address, attributes and latency", func(t *testing.T) {
		var healthy []leaseapi.ProxyInfo
		poll.Until(t, wait, "the healthy proxies listed", func() error {
			var err error
			healthy, err = c.List(ctx, leaseapi.ListFilter{HealthyOnly: true})
			if err != nil {
				return err
			}
			if got := names(healthy); !slices.Equal(got, []string{eu1, us}) {
				return fmt.Errorf("healthy=true lists %v", got)
			}
			return nil
		})
		p := healthy[0]
		if p.URL != "http://127.0.0.11:3128" || p.Attributes["region"] != "eu" || p.Attributes["tier"] != "dc" || p.LatencyMillis != 42 || !p.Healthy {
			t.Fatalf("eu-1 listed as %+v", p)
		}
	})

	t.Run("attribute selectors choose among the healthy proxies", func(t *testing.T) {
		eu, err := c.List(ctx, leaseapi.ListFilter{Attributes: map[string]string{"region": "eu"}})
		if err != nil || !slices.Equal(names(eu), []string{eu1, eu2}) {
			t.Fatalf("attr.region=eu lists %v (%v)", names(eu), err)
		}
		for range 3 {
			l, err := c.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "eu"}, Target: "example.com", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if l.Member.Name != eu1 || l.Member.URL.String() != "http://127.0.0.11:3128" {
				t.Fatalf("region=eu leased %s at %v, want only the healthy %s", l.Member.Name, l.Member.URL, eu1)
			}
			if err := c.Release(ctx, l.ID); err != nil {
				t.Fatal(err)
			}
		}
		l, err := c.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "us", "tier": "dc"}})
		if err != nil || l.Member.Name != us {
			t.Fatalf("region=us,tier=dc leased %+v (%v), want %s", l.Member, err, us)
		}
		_, err = c.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"tier": "res"}})
		var nm *pool.NoMatchError
		if !errors.As(err, &nm) || nm.Considered != 1 || nm.Unhealthy != 1 {
			t.Fatalf("tier=res acquire = %v, want a 409 with 1 unhealthy", err)
		}
	})

	t.Run("a cooldown survives a status update of the proxy", func(t *testing.T) {
		l, err := c.Acquire(ctx, pool.AcquireRequest{Proxy: eu1, Target: "shop.example"})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Report(ctx, l.ID, pool.Report{Result: rotation.ResultRateLimited}); err != nil {
			t.Fatal(err)
		}
		r.setHealthy(t, "eu-1", true, 55)
		poll.Until(t, wait, "eu-1 listed with its latency and cooldown", func() error {
			ps, err := c.List(ctx, leaseapi.ListFilter{Attributes: map[string]string{"tier": "dc", "region": "eu"}})
			if err != nil || len(ps) != 1 || ps[0].LatencyMillis != 55 {
				return fmt.Errorf("eu-1 listed as %+v (%v), want latency 55", ps, err)
			}
			if len(ps[0].Cooldowns) != 1 || ps[0].Cooldowns[0].Target != "shop.example" {
				return fmt.Errorf("eu-1 cooldowns %+v, want one for shop.example", ps[0].Cooldowns)
			}
			return nil
		})
		_, err = c.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "eu"}, Target: "shop.example"})
		var nm *pool.NoMatchError
		if !errors.As(err, &nm) || nm.InCooldown != 1 || nm.Unhealthy != 1 {
			t.Fatalf("acquire for the cooled target = %v, want a 409 with 1 in cooldown, 1 unhealthy", err)
		}
		if other, err := c.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "eu"}, Target: "other.example"}); err != nil || other.Member.Name != eu1 {
			t.Fatalf("acquire for another target = %+v (%v), want %s", other.Member, err, eu1)
		}
	})

	t.Run("a proxy that turns unhealthy is no longer offered", func(t *testing.T) {
		r.setHealthy(t, "us-1", false, 7)
		poll.Until(t, wait, "us-1 no longer offered", func() error {
			_, err := c.Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "us"}})
			var nm *pool.NoMatchError
			if !errors.As(err, &nm) || nm.Unhealthy != 1 {
				return fmt.Errorf("acquire region=us = %v, want a 409 with 1 unhealthy", err)
			}
			return nil
		})
	})

	t.Run("an edited endpoint is not offered on the old address's verdict", func(t *testing.T) {
		var p v1alpha1.Proxy
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: "eu-1"}, &p); err != nil {
			t.Fatal(err)
		}
		p.Spec.Endpoint.Host = "127.0.0.15"
		if err := env.Client.Update(ctx, &p); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, wait, "eu-1 no longer offered", func() error {
			_, err := c.Acquire(ctx, pool.AcquireRequest{Proxy: eu1})
			var nm *pool.NoMatchError
			if !errors.As(err, &nm) || nm.Unhealthy != 1 {
				return fmt.Errorf("acquire %s = %v, want a 409 with 1 unhealthy", eu1, err)
			}
			return nil
		})
		r.setHealthy(t, "eu-1", true, 30)
		poll.Until(t, wait, "eu-1 offered again", func() error {
			l, err := c.Acquire(ctx, pool.AcquireRequest{Proxy: eu1})
			if err != nil {
				return err
			}
			if l.Member.URL.String() != "http://127.0.0.15:3128" {
				return fmt.Errorf("leased %s at %v, want the new endpoint", eu1, l.Member.URL)
			}
			return c.Release(ctx, l.ID)
		})
	})

	t.Run("a deleted proxy disappears", func(t *testing.T) {
		p := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "eu-2"}}
		if err := env.Client.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, wait, "the deleted proxy gone from the list", func() error {
			all, err := c.List(ctx, leaseapi.ListFilter{})
			if err != nil {
				return err
			}
			if got := names(all); !slices.Equal(got, []string{eu1, us}) {
				return fmt.Errorf("listed %v after deleting eu-2", got)
			}
			return nil
		})
	})

	t.Run("the bearer token is required", func(t *testing.T) {
		_, err := r.client(t, "").List(ctx, leaseapi.ListFilter{})
		var apiErr *leaseapi.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized {
			t.Fatalf("list without a token = %v, want 401", err)
		}
		resp, err := http.Get(r.url + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthz without a token = %d, want 200", resp.StatusCode)
		}
	})

	if r.rec.count(leaseapi.LeaseOutcomeGranted) == 0 || r.rec.count(leaseapi.LeaseOutcomeNoMatch) == 0 {
		t.Errorf("recorder saw granted=%d no_match=%d, want both counted", r.rec.count(leaseapi.LeaseOutcomeGranted), r.rec.count(leaseapi.LeaseOutcomeNoMatch))
	}
	if strings.Contains(r.logs.String(), AuthDisabledWarning) {
		t.Error("auth-disabled warning logged although a token is set")
	}
}

func TestLeaseAPIWithoutATokenWarnsLoudly(t *testing.T) {
	r := startAPI(t, "")
	r.external(t, "px", "127.0.0.21", nil)
	r.setHealthy(t, "px", true, 1)
	c := r.client(t, "")
	poll.Until(t, wait, "the healthy proxy listed without a token", func() error {
		ps, err := c.List(context.Background(), leaseapi.ListFilter{HealthyOnly: true})
		if err != nil || len(ps) != 1 {
			return fmt.Errorf("healthy proxies %v (%v), want 1 without any token", ps, err)
		}
		return nil
	})
	if !strings.Contains(r.logs.String(), AuthDisabledWarning) {
		t.Fatalf("no %q in the log:\n%s", AuthDisabledWarning, r.logs.String())
	}
}

// managedWithLogin creates a Managed Proxy running at ip, Healthy, and its
// generated login Secret (controlled by the Proxy, labelled), as the
// reconciler and the health engine would leave a bootstrapped VM.
func (r *running) managedWithLogin(t *testing.T, name, ip, password string) *corev1.Secret {
	t.Helper()
	ctx := context.Background()
	p := gen.Proxy(name, gen.SetProxyNamespace(r.ns), gen.SetProxyManaged("gcp-eu"))
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatalf("create Proxy %s: %v", name, err)
	}
	p.Status.IP = ip
	if err := env.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	r.setHealthy(t, name, true, 3)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: credentials.GeneratedSecretName(p),
			Labels: map[string]string{v1alpha1.LabelCredentials: v1alpha1.ValueTrue}},
		Type: corev1.SecretTypeBasicAuth,
		Data: map[string][]byte{"username": []byte("proxyfleet"), "password": []byte(password)},
	}
	if err := controllerutil.SetControllerReference(p, s, env.Client.Scheme()); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, s); err != nil {
		t.Fatalf("create the login Secret: %v", err)
	}
	return s
}

func TestLeaseAPIHandsTheLoginWithTheLeaseOnly(t *testing.T) {
	const token = "lease-t0ken"
	r := startAPI(t, token)
	c := r.client(t, token)
	ctx := context.Background()
	const pw = "gener4ted-pa55word"
	s := r.managedWithLogin(t, "vm", "127.0.0.31", pw)
	vm := r.ns + "/vm"

	lease := func(member, want string) {
		t.Helper()
		poll.Until(t, wait, "a lease on "+member, func() error {
			l, err := c.Acquire(ctx, pool.AcquireRequest{Proxy: member})
			if err != nil {
				return err
			}
			defer func() { _ = c.Release(ctx, l.ID) }()
			if got := l.Member.URL.String(); got != want {
				return fmt.Errorf("leased %s at %s, want %s", member, l.Member.Redacted(), want)
			}
			return nil
		})
	}
	lease(vm, "http://proxyfleet:"+pw+"@127.0.0.31:3128")

	// The list is for discovery: the password is masked there.
	code, body := getBody(t, r.url+"/v1/proxies", token)
	if code != http.StatusOK || strings.Contains(body, pw) || !strings.Contains(body, `"url":"http://proxyfleet:xxxxx@127.0.0.31:3128"`) {
		t.Fatalf("GET /v1/proxies = %d %s, want the member with its password masked", code, body)
	}

	// A rotated login reaches the next lease without any Proxy event.
	s.Data["password"] = []byte("r0tated-" + pw)
	if err := env.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	lease(vm, "http://proxyfleet:r0tated-"+pw+"@127.0.0.31:3128")

	// An External Proxy's scheme and credentialsSecretRef make its URL.
	vendor := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "vendor-login",
			Labels: map[string]string{v1alpha1.LabelCredentials: v1alpha1.ValueTrue}},
		Data: map[string][]byte{"username": []byte("crawler"), "password": []byte("v3ndor/" + pw)},
	}
	if err := env.Client.Create(ctx, vendor); err != nil {
		t.Fatal(err)
	}
	ext := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: "vendor", Namespace: r.ns},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ModeExternal, Endpoint: &v1alpha1.Endpoint{
			Host: "127.0.0.33", Port: 1080, Scheme: v1alpha1.SchemeSOCKS5,
			CredentialsSecretRef: &v1alpha1.SecretRef{Name: "vendor-login"}}},
	}
	if err := env.Client.Create(ctx, ext); err != nil {
		t.Fatal(err)
	}
	r.setHealthy(t, "vendor", true, 2)
	lease(r.ns+"/vendor", "socks5://crawler:v3ndor%2F"+pw+"@127.0.0.33:1080")
	if strings.Contains(r.logs.String(), pw) {
		t.Fatal("the lease API logged a proxy password")
	}
}

func TestLeaseAPIWithoutATokenWithholdsProxiesThatHaveALogin(t *testing.T) {
	r := startAPI(t, "")
	r.external(t, "open", "127.0.0.22", nil)
	r.setHealthy(t, "open", true, 1)
	const pw = "never-handed-0ut"
	r.managedWithLogin(t, "vm", "127.0.0.32", pw)
	c := r.client(t, "")
	ctx := context.Background()
	poll.Until(t, wait, "the Proxy with a withheld login left out", func() error {
		if !strings.Contains(r.logs.String(), "withheld") {
			return errors.New("no log line naming the withheld Proxy yet")
		}
		ps, err := c.List(ctx, leaseapi.ListFilter{})
		if err != nil || !slices.Equal(names(ps), []string{r.ns + "/open"}) {
			return fmt.Errorf("listed %v (%v), want only the Proxy without a login", names(ps), err)
		}
		return nil
	})
	_, err := c.Acquire(ctx, pool.AcquireRequest{Proxy: r.ns + "/vm"})
	var nm *pool.NoMatchError
	if !errors.As(err, &nm) || nm.Considered != 0 {
		t.Fatalf("acquire of the Proxy with a login = %v, want a 409 considering nothing", err)
	}
	if !strings.Contains(r.logs.String(), r.ns+"/vm") || strings.Contains(r.logs.String(), pw) {
		t.Fatalf("the log must name the withheld Proxy and never its password:\n%s", r.logs.String())
	}
}

// getBody GETs url with a bearer token and returns the status and body.
func getBody(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
