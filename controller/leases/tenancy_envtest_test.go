package leases

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller"
	"github.com/proxyfleet/proxyfleet/internal/testkit/redis"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/pool/redisstore"
)

// tenants is a lease API over every namespace with token review, a
// crawler namespace A whose service account may lease, and an owner
// namespace B with a pool "eu" of two Proxies and one Proxy of no pool,
// all Healthy and with one attribute the test's selectors share (so that
// other tests' Proxies, visible to this cache, never match).
type tenants struct {
	*running
	a, b   string
	token  string // A's crawler's projected service-account token
	static string // the static token
	tag    map[string]string
}

func startTenants(t *testing.T, tenancy string) *tenants {
	t.Helper()
	return startTenantsOn(t, tenancy, nil)
}

// startTenantsOn is startTenants on backend (nil: the in-memory store).
func startTenantsOn(t *testing.T, tenancy string, backend pool.LeaseStore) *tenants {
	t.Helper()
	a, b := env.Namespace(t), env.Namespace(t)
	tn := &tenants{a: a, b: b, static: "operator-token", tag: map[string]string{"suite": b}}
	tn.running = startAPIOn(t, a, "", tn.static, func(o *Options) {
		o.Reviewer = &Reviewer{Client: env.Client, TTL: time.Minute}
		o.Tenancy = tenancy
		o.Backend = backend
	}, func(mgr ctrl.Manager) error {
		return (&controller.ProxyGrantReconciler{Recheck: time.Second, SkipNameValidation: true}).SetupWithManager(mgr)
	})
	ctx := context.Background()
	if err := env.Client.Create(ctx, gen.ProxyPool("eu", gen.SetProxyPoolNamespace(b), gen.SetProxyPoolTemplate(v1alpha1.ProxySpec{
		Mode: v1alpha1.ModeExternal, Endpoint: &v1alpha1.Endpoint{Host: "127.0.0.1", Port: 3128}}))); err != nil {
		t.Fatal(err)
	}
	// The pool's Proxies as its reconciler makes them: labelled with the
	// pool. No reconciler runs here; the label is what tenancy reads.
	for _, p := range []struct {
		name, pool string
		attrs      map[string]string
	}{
		{"eu-1", "eu", map[string]string{"region": "eu"}},
		{"eu-2", "eu", map[string]string{"region": "eu"}},
		// A Proxy that claims to be A's through its attributes: the
		// controller's own attributes win.
		{"loose", "", map[string]string{"region": "us", AttributeNamespace: a}},
	} {
		attrs := map[string]string{"suite": b}
		for k, v := range p.attrs {
			attrs[k] = v
		}
		px := gen.Proxy(p.name, gen.SetProxyNamespace(b), gen.SetProxyEndpoint("127.0.0.1", 3128), gen.SetProxyAttributes(attrs))
		if p.pool != "" {
			px.Labels = map[string]string{v1alpha1.LabelPool: p.pool}
		}
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		healthyIn(t, b, p.name)
	}
	leaseUserRole(t)
	bindLeaseUser(t, a, "crawler")
	tn.token = serviceAccountToken(t, a, "crawler", DefaultTokenAudience)
	// Every Proxy at the source: the operator's token leases all three.
	poll.Until(t, wait, "B's three Proxies at the source", func() error {
		ps, err := tn.client(t, tn.static).List(ctx, leaseapi.ListFilter{Attributes: tn.tag})
		if err != nil || len(ps) != 3 {
			return errors.New("not yet")
		}
		return nil
	})
	return tn
}

// healthyIn marks the Proxy ns/name Healthy at its endpoint, as the
// reconciler does for the health engine.
func healthyIn(t *testing.T, ns, name string) {
	t.Helper()
	ctx := context.Background()
	var p v1alpha1.Proxy
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue,
		Reason: v1alpha1.ReasonProbeSucceeded, Message: "set by the test", ObservedGeneration: p.Generation})
	p.Status.IP = p.EffectiveHost()
	if err := env.Client.Status().Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
}

// acquire leases as token with sel (the test's tag added) or a pin.
func (tn *tenants) acquire(t *testing.T, token string, sel map[string]string, pin string) (pool.Lease, error) {
	t.Helper()
	s := map[string]string{}
	for k, v := range tn.tag {
		s[k] = v
	}
	for k, v := range sel {
		s[k] = v
	}
	if pin != "" {
		s = nil
	}
	l, err := tn.client(t, token).Acquire(context.Background(), pool.AcquireRequest{Selector: s, Proxy: pin, TTL: 30 * time.Second})
	if err == nil {
		_ = tn.client(t, token).Release(context.Background(), l.ID)
	}
	return l, err
}

// grant writes B's ProxyGrant sharing pools (none: every Proxy) with A.
func (tn *tenants) grant(t *testing.T, name string, to []string, pools ...string) *v1alpha1.ProxyGrant {
	t.Helper()
	g := &v1alpha1.ProxyGrant{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tn.b}, Spec: v1alpha1.ProxyGrantSpec{Pools: pools}}
	for _, ns := range to {
		g.Spec.To = append(g.Spec.To, v1alpha1.GrantSubject{Namespace: ns})
	}
	if err := env.Client.Create(context.Background(), g); err != nil {
		t.Fatalf("create ProxyGrant: %v", err)
	}
	return g
}

// apiRefusal is the lease API's error body for err, or "" when err is none.
func apiRefusal(err error) (status int, code, msg string) {
	var ae *leaseapi.APIError
	if errors.As(err, &ae) {
		return ae.Status, ae.Code, ae.Message
	}
	return 0, "", ""
}

// Tenancy lives above the store: the in-memory store and the shared Redis
// store (a real redis-server) serve it alike.
func TestANamespaceLeasesOnlyItsOwnProxiesAndWhatIsSharedWithIt(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			var backend pool.LeaseStore
			if store == "redis" {
				r := redis.Start(t, redis.Options{})
				rs, err := redisstore.NewRedisStore(redisstore.RedisOptions{URL: r.URL(), Prefix: "tenancy"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = rs.Close() })
				backend = rs
			}
			testTenancy(t, startTenantsOn(t, TenancyNamespaced, backend))
		})
	}
}

func testTenancy(t *testing.T, tn *tenants) {
	ctx := context.Background()
	pinned := tn.b + "/eu-1"

	t.Run("before any grant", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			sel  map[string]string
			pin  string
			want []string // in the 403's message
		}{
			{"a selector matching only B's pool is 403 naming A and the pool", map[string]string{"region": "eu"}, "", []string{"namespace " + tn.a, "pool " + tn.b + "/eu", "ProxyGrant"}},
			{"a pin on B's Proxy is 403 naming the pool", nil, pinned, []string{"namespace " + tn.a, "pool " + tn.b + "/eu"}},
			{"a selector naming B's namespace cannot reach around it", map[string]string{AttributeNamespace: tn.b}, "", []string{"pool " + tn.b + "/eu", "namespace " + tn.b + " in no pool"}},
			{"a Proxy whose attributes claim A's namespace is still B's", map[string]string{"region": "us"}, "", []string{"namespace " + tn.b + " in no pool"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := tn.acquire(t, tn.token, tc.sel, tc.pin)
				status, code, msg := apiRefusal(err)
				if status != http.StatusForbidden || code != "not_shared" {
					t.Fatalf("acquire: %v; want 403 not_shared", err)
				}
				for _, w := range tc.want {
					if !strings.Contains(msg, w) {
						t.Errorf("403 message %q does not name %q", msg, w)
					}
				}
			})
		}
		t.Run("a selector matching nothing at all is still a 409, not a 403", func(t *testing.T) {
			_, err := tn.acquire(t, tn.token, map[string]string{"region": "nowhere"}, "")
			var nm *pool.NoMatchError
			if !errors.As(err, &nm) || nm.Considered != 0 {
				t.Fatalf("acquire: %v; want 409 with nothing considered", err)
			}
			// The ProxyPool autoscaler reads the refusal narrowed to A's
			// share, so it grows no pool of a namespace A may not use.
			narrowed := tn.api.LastRefusal(func(sel map[string]string, _ string) bool {
				return sel["region"] == "nowhere" && sel[AttributeNamespace] == tn.a
			})
			wide := tn.api.LastRefusal(func(sel map[string]string, _ string) bool {
				return sel["region"] == "nowhere" && sel[AttributeNamespace] != tn.a
			})
			if narrowed.IsZero() || !wide.IsZero() {
				t.Fatalf("refusal log: narrowed to A at %v, otherwise at %v; want only the narrowed one", narrowed, wide)
			}
		})
		t.Run("A's list holds none of B's Proxies, so its last-known pool cannot either", func(t *testing.T) {
			ps, err := tn.client(t, tn.token).List(ctx, leaseapi.ListFilter{Attributes: tn.tag, Credentials: true})
			if err != nil || len(ps) != 0 {
				t.Fatalf("A lists %v (%v), want nothing", names(ps), err)
			}
		})
		t.Run("the operator's static token still leases every namespace's Proxies", func(t *testing.T) {
			if _, err := tn.acquire(t, tn.static, map[string]string{"region": "eu"}, ""); err != nil {
				t.Fatal(err)
			}
		})
	})

	g := tn.grant(t, "share-eu", []string{tn.a}, "eu")
	t.Run("once B shares pool eu with A", func(t *testing.T) {
		poll.Until(t, wait, "A leasing from B's shared pool", func() error {
			_, err := tn.acquire(t, tn.token, map[string]string{"region": "eu"}, "")
			return err
		})
		for range 4 {
			l, err := tn.acquire(t, tn.token, map[string]string{"region": "eu"}, "")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(l.Member.Name, tn.b+"/eu-") || l.Member.Attributes[AttributePool] != "eu" || l.Member.Attributes[AttributeNamespace] != tn.b {
				t.Fatalf("A leased %s %v, want one of B's pool eu", l.Member.Name, l.Member.Attributes)
			}
		}
		if _, err := tn.acquire(t, tn.token, nil, pinned); err != nil {
			t.Fatalf("pin on a shared Proxy: %v", err)
		}
		ps, err := tn.client(t, tn.token).List(ctx, leaseapi.ListFilter{Attributes: tn.tag})
		if got := names(ps); err != nil || !slices.Equal(got, []string{tn.b + "/eu-1", tn.b + "/eu-2"}) {
			t.Fatalf("A lists %v (%v), want B's pool eu only", got, err)
		}
		_, err = tn.acquire(t, tn.token, map[string]string{"region": "us"}, "")
		if status, _, msg := apiRefusal(err); status != http.StatusForbidden || !strings.Contains(msg, "namespace "+tn.b+" in no pool") {
			t.Fatalf("B's Proxy of no pool: %v; want 403 naming it (only pool eu is shared)", err)
		}
		poll.Until(t, wait, "the grant Resolved", func() error { return resolved(g, metav1.ConditionTrue, v1alpha1.ReasonAllFound) })
	})

	t.Run("revoking the share stops new leases", func(t *testing.T) {
		held, err := tn.client(t, tn.token).Acquire(ctx, pool.AcquireRequest{Selector: map[string]string{"region": "eu", "suite": tn.b}, TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(ctx, g); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		poll.Until(t, wait, "A refused once the grant is gone", func() error {
			_, err := tn.acquire(t, tn.token, map[string]string{"region": "eu"}, "")
			if status, _, _ := apiRefusal(err); status != http.StatusForbidden {
				return errors.New("still leased: " + errString(err))
			}
			return nil
		})
		t.Logf("refused %s after the grant was deleted", time.Since(start).Round(time.Millisecond))
		// A lease taken before runs to its TTL: it can still be reported
		// on and released (docs/tenancy.md, "Revoking").
		if err := tn.client(t, tn.token).Report(ctx, held.ID, pool.Report{Result: "ok"}); err != nil {
			t.Errorf("report on a lease taken before the revocation: %v", err)
		}
		if err := tn.client(t, tn.token).Release(ctx, held.ID); err != nil {
			t.Errorf("release: %v", err)
		}
	})

	t.Run("a whole-namespace grant shares B's Proxies of no pool too", func(t *testing.T) {
		tn.grant(t, "share-all", []string{tn.a})
		poll.Until(t, wait, "A leasing B's Proxy of no pool", func() error {
			_, err := tn.acquire(t, tn.token, map[string]string{"region": "us"}, "")
			return err
		})
	})
}

func TestAProxyGrantNamingWhatDoesNotExistSaysSo(t *testing.T) {
	tn := startTenants(t, TenancyNamespaced)
	for _, tc := range []struct {
		name   string
		to     []string
		pools  []string
		reason string
		want   string
	}{
		{"a namespace that does not exist", []string{tn.a, "no-such-team"}, nil, v1alpha1.ReasonNamespaceNotFound, "namespace no-such-team in spec.to does not exist"},
		{"a pool that does not exist", []string{tn.a}, []string{"eu", "asia"}, v1alpha1.ReasonPoolNotFound, "ProxyPool asia in spec.pools does not exist in namespace " + tn.b},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tn.grant(t, strings.ReplaceAll(strings.ToLower(tc.reason), "notfound", "-missing"), tc.to, tc.pools...)
			poll.Until(t, wait, "Resolved False "+tc.reason, func() error { return resolved(g, metav1.ConditionFalse, tc.reason) })
			var got v1alpha1.ProxyGrant
			if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(g), &got); err != nil {
				t.Fatal(err)
			}
			if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionResolved); !strings.Contains(c.Message, tc.want) {
				t.Fatalf("Resolved message %q, want %q", c.Message, tc.want)
			}
			// What exists is shared all the same.
			if _, err := tn.acquire(t, tn.token, map[string]string{"region": "eu"}, ""); err != nil {
				t.Fatalf("A leasing the existing pool eu through the grant: %v", err)
			}
			if err := env.Client.Delete(context.Background(), g); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("a namespace name the API server refuses", func(t *testing.T) {
		g := &v1alpha1.ProxyGrant{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: tn.b},
			Spec: v1alpha1.ProxyGrantSpec{To: []v1alpha1.GrantSubject{{Namespace: "Team_A"}}}}
		err := env.Client.Create(context.Background(), g)
		if err == nil || !strings.Contains(err.Error(), "to.namespace must be a namespace name") {
			t.Fatalf("create: %v; want the validation message", err)
		}
		empty := &v1alpha1.ProxyGrant{ObjectMeta: metav1.ObjectMeta{Name: "empty", Namespace: tn.b}}
		if err := env.Client.Create(context.Background(), empty); err == nil || !strings.Contains(err.Error(), "spec.to") {
			t.Fatalf("create with no spec.to: %v; want it refused naming spec.to", err)
		}
	})
}

// The upgrade path: with tenancy cluster-wide a pod identity leases any
// namespace's Proxies without a grant, as before ProxyGrants existed.
func TestClusterWideTenancyKeepsTheBehaviourBeforeGrants(t *testing.T) {
	tn := startTenants(t, TenancyClusterWide)
	l, err := tn.acquire(t, tn.token, map[string]string{"region": "eu"}, "")
	if err != nil {
		t.Fatalf("A leasing B's Proxies under cluster-wide tenancy: %v", err)
	}
	if !strings.HasPrefix(l.Member.Name, tn.b+"/") {
		t.Fatalf("leased %s", l.Member.Name)
	}
	ps, err := tn.client(t, tn.token).List(context.Background(), leaseapi.ListFilter{Attributes: tn.tag})
	if err != nil || len(ps) != 3 {
		t.Fatalf("A lists %v (%v), want B's three", names(ps), err)
	}
	if !strings.Contains(tn.logs.String(), "tenancy cluster-wide") {
		t.Errorf("no warning in the log about cluster-wide tenancy:\n%s", tn.logs.String())
	}
}

// resolved is nil when g's Resolved condition has status and reason.
func resolved(g *v1alpha1.ProxyGrant, status metav1.ConditionStatus, reason string) error {
	var got v1alpha1.ProxyGrant
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(g), &got); err != nil {
		return err
	}
	c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionResolved)
	if c == nil || c.Status != status || c.Reason != reason {
		return errors.New("Resolved is " + condString(c))
	}
	return nil
}

func condString(c *metav1.Condition) string {
	if c == nil {
		return "unset"
	}
	return string(c.Status) + " " + c.Reason + ": " + c.Message
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
