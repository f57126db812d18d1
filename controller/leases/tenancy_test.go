package leases

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/pool"
)

func grantOf(ns string, to []string, pools ...string) v1alpha1.ProxyGrant {
	g := v1alpha1.ProxyGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g"}, Spec: v1alpha1.ProxyGrantSpec{Pools: pools}}
	for _, n := range to {
		g.Spec.To = append(g.Spec.To, v1alpha1.GrantSubject{Namespace: n})
	}
	return g
}

func TestScopesOf(t *testing.T) {
	deleting := grantOf("b", []string{"a"})
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	for _, tc := range []struct {
		name   string
		grants []v1alpha1.ProxyGrant
		want   []scope
	}{
		{"without grants a namespace leases its own Proxies only", nil, []scope{{ns: "a"}}},
		{"a grant to another namespace shares nothing with this one", []v1alpha1.ProxyGrant{grantOf("b", []string{"c"})}, []scope{{ns: "a"}}},
		{"a grant without pools shares the owner's whole namespace", []v1alpha1.ProxyGrant{grantOf("b", []string{"c", "a"})}, []scope{{ns: "a"}, {ns: "b"}}},
		{"a grant with pools shares those pools", []v1alpha1.ProxyGrant{grantOf("b", []string{"a"}, "eu", "us")}, []scope{{ns: "a"}, {"b", "eu"}, {"b", "us"}}},
		{"a whole-namespace grant covers that namespace's pool grants", []v1alpha1.ProxyGrant{grantOf("b", []string{"a"}, "eu"), grantOf("b", []string{"a"})}, []scope{{ns: "a"}, {ns: "b"}}},
		{"own egress first, then the shares sorted", []v1alpha1.ProxyGrant{grantOf("z", []string{"a"}), grantOf("b", []string{"a"}, "eu")}, []scope{{ns: "a"}, {"b", "eu"}, {ns: "z"}}},
		{"a grant in the consumer's own namespace adds nothing", []v1alpha1.ProxyGrant{grantOf("a", []string{"a"}, "eu")}, []scope{{ns: "a"}}},
		{"a grant being deleted shares nothing", []v1alpha1.ProxyGrant{deleting}, []scope{{ns: "a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := scopesOf("a", tc.grants); !slices.Equal(got, tc.want) {
				t.Fatalf("scopes %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNarrowKeepsTheCrawlersSelectorInsideTheScope(t *testing.T) {
	for _, tc := range []struct {
		name string
		sel  map[string]string
		s    scope
		want map[string]string // nil: the scope can match nothing
	}{
		{"no selector becomes the scope", nil, scope{ns: "a"}, map[string]string{AttributeNamespace: "a"}},
		{"a selector gets the scope's pairs", map[string]string{"region": "eu"}, scope{"b", "eu"}, map[string]string{"region": "eu", AttributeNamespace: "b", AttributePool: "eu"}},
		{"a selector naming another namespace matches nothing in this scope", map[string]string{AttributeNamespace: "b"}, scope{ns: "a"}, nil},
		{"a selector naming another pool matches nothing in this scope", map[string]string{AttributePool: "us"}, scope{"b", "eu"}, nil},
		{"a selector naming the scope's own namespace is kept", map[string]string{AttributeNamespace: "b"}, scope{"b", "eu"}, map[string]string{AttributeNamespace: "b", AttributePool: "eu"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := pool.Narrow(tc.sel, tc.s.selector())
			if ok != (tc.want != nil) || len(got) != len(tc.want) {
				t.Fatalf("narrow = %v, %v; want %v", got, ok, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("narrow = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// The pool package's copies of the controller's member attributes, which
// a gateway's token clients select pools with, are the same keys.
func TestPoolAttributesAreTheControllers(t *testing.T) {
	if pool.AttributeNamespace != AttributeNamespace || pool.AttributePool != AttributePool {
		t.Fatalf("pool's attributes %q, %q differ from the controller's %q, %q", pool.AttributeNamespace, pool.AttributePool, AttributeNamespace, AttributePool)
	}
}
