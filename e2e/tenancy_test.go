package e2e

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/leases"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

// TestSidecarLeasesOnlyWhatItsNamespaceWasGranted is tenancy as a crawler
// sees it (docs/tenancy.md): the real controller binary over every
// namespace with token review and namespaced tenancy (the default), a
// ProxyPool of namespace B at a real Squid, and the real sidecar binary in
// sidecar mode (--lease-api, --pool-sa-token-file with a projected token
// of namespace A's service account, the injected --pool-selector) in front
// of A's crawler. A's crawler is refused with 403 naming A and B's pool
// until B shares the pool with a ProxyGrant, then reaches the site through
// B's Squid; once the grant is deleted a new site is refused at once, and
// the sticky session of the first site keeps its member until its lease
// ends, then is refused too.
func TestSidecarLeasesOnlyWhatItsNamespaceWasGranted(t *testing.T) {
	bin := testutil.BuildBinary(t)
	sidecarBin := testutil.BuildSidecarBinary(t)
	env := testenv.Start(t)
	ctx := context.Background()
	ownerNS, crawlNS := env.Namespace(t), env.Namespace(t)

	kubeconfig := env.WriteKubeconfig(t)
	_, addrs := testutil.StartProcessOnFreePorts(t, bin, 3, func(addrs []string) testutil.ProcessOptions {
		return testutil.ProcessOptions{
			Name: "controller[" + t.Name() + "]",
			Args: []string{"controller", "--kubeconfig", kubeconfig,
				"--metrics-listen", addrs[0], "--health-probe-listen", addrs[1], "--lease-api-listen", addrs[2],
				"--webhook-listen", "0", "--status-listen", "0", "--lease-api-token-review",
				"--health-tick", "100ms", "--log-format", "text"},
			WaitAddrs:       addrs,
			ExpectCleanExit: true,
		}
	})
	leaseAPI := "http://" + addrs[2]

	// B's pool: one External Proxy at a real Squid, probed healthy.
	squid := startSquids(t, "tenancy", "127.0.0.193")[0]
	probe := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.1"})
	pool := gen.ProxyPool("eu", gen.SetProxyPoolNamespace(ownerNS), gen.SetProxyPoolReplicas(1),
		gen.SetProxyPoolTemplate(gen.Proxy("unused", gen.SetProxyEndpoint("127.0.0.1", int32(squid.Port())),
			gen.SetProxyAttributes(map[string]string{"region": "eu"}),
			gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: probe.URL() + "/probe", IntervalSeconds: 1, TimeoutSeconds: 1})).Spec))
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, "B's pool Ready", func() error {
		var p v1alpha1.ProxyPool
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
			return err
		}
		return poll.Check(p.Status.ReadyReplicas == 1, "status %+v", p.Status)
	})

	// A's crawler: a service account bound to proxyfleet-lease-user in A,
	// and its projected token (audience proxyfleet) where the sidecar reads it.
	must := func(err error) {
		t.Helper()
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "crawler", Namespace: crawlNS}}
	must(env.Client.Create(ctx, sa))
	must(env.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: leases.LeaseUserClusterRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{leases.LeaseGroup}, Resources: []string{leases.LeaseResource}, Verbs: []string{leases.LeaseVerb}}}}))
	must(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "crawler-leases", Namespace: crawlNS},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: leases.LeaseUserClusterRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "crawler", Namespace: crawlNS}}}))
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{leases.DefaultTokenAudience}, ExpirationSeconds: ptr.To[int64](3600)}}
	if err := env.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeFile(t, tokenFile, tr.Status.Token)

	// The sidecar as injected (--lease-api, --pool-sa-token-file, the pod's
	// --pool-selector), its lease TTL 30s so the sticky session's end is seen.
	const leaseTTL = 30 * time.Second
	sc := startGateway(t, sidecarBin, gwConfig{args: []string{"--lease-api", leaseAPI, "--pool-sa-token-file", tokenFile,
		"--pool-selector", "region=eu", "--lease-ttl", leaseTTL.String()}})
	c := sc.client(t, "", nil)
	sticky := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.194"})
	fresh := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.195"})
	refused := func(r getResult) error {
		return poll.Check(r.status == http.StatusForbidden && r.reason == "pool_forbidden" &&
			strings.Contains(r.body, "namespace "+crawlNS) && strings.Contains(r.body, "pool "+ownerNS+"/eu"),
			"%d %s %q", r.status, r.reason, r.body)
	}
	servedByB := func(r getResult) error {
		return poll.Check(r.status == http.StatusOK && r.source == squid.OutgoingAddr(), "%d from %q (%s %q)", r.status, r.source, r.reason, r.body)
	}
	get := func(target *testutil.Target, path string) getResult {
		t.Helper()
		r, err := doGet(c, target.URL()+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	// The source may not have B's Proxy yet: a 503 no member is retried.
	poll.Until(t, pollTimeout, "A's crawler refused B's pool with 403 naming both", func() error {
		return refused(get(sticky, "/before"))
	})
	if sticky.Count(squid.OutgoingAddr()) != 0 {
		t.Fatal("the site saw B's Squid before any grant")
	}

	grant := &v1alpha1.ProxyGrant{ObjectMeta: metav1.ObjectMeta{Name: "share-eu", Namespace: ownerNS},
		Spec: v1alpha1.ProxyGrantSpec{To: []v1alpha1.GrantSubject{{Namespace: crawlNS}}, Pools: []string{"eu"}}}
	if err := env.Client.Create(ctx, grant); err != nil {
		t.Fatal(err)
	}
	var leased time.Time
	poll.Until(t, pollTimeout, "A's crawler served through B's Squid once B shares pool eu", func() error {
		leased = time.Now()
		return servedByB(get(sticky, "/shared"))
	})

	if err := env.Client.Delete(ctx, grant); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	poll.Until(t, pollTimeout, "a new site refused once the grant is deleted", func() error {
		return refused(get(fresh, "/after-revoke"))
	})
	t.Logf("a new lease refused %s after the grant was deleted", time.Since(revoked).Round(time.Millisecond))
	if fresh.Count(squid.OutgoingAddr()) != 0 {
		t.Error("the new site was reached through B's Squid after the grant was deleted")
	}
	// The sticky session's lease was taken before: it runs to its TTL.
	if time.Since(leased) < leaseTTL-5*time.Second {
		if err := servedByB(get(sticky, "/sticky-after-revoke")); err != nil {
			t.Errorf("the sticky session's held lease, %s old, no longer served: %v", time.Since(leased).Round(time.Millisecond), err)
		}
	} else {
		t.Logf("the sticky session's lease is %s old: too close to its end to check it still serves", time.Since(leased).Round(time.Millisecond))
	}
	poll.Until(t, pollTimeout, "the sticky session refused once its lease ended", func() error {
		return refused(get(sticky, "/sticky-later"))
	})
	if ended := time.Since(leased); ended < leaseTTL-time.Second {
		t.Errorf("the sticky session was refused %s after its lease began, before the lease's TTL %s", ended.Round(time.Millisecond), leaseTTL)
	}
	t.Logf("the sticky session refused %s after its lease began (TTL %s)", time.Since(leased).Round(time.Millisecond), leaseTTL)
}
