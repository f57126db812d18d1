package leases

import (
	"errors"
	"net/url"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/pool"
)

// inCrawl is where these cases' Proxies live: namespace crawl, at
// 10.0.0.1:3128.
func inCrawl(p *v1alpha1.Proxy) {
	gen.SetProxyNamespace("crawl")(p)
	gen.SetProxyEndpoint("10.0.0.1", 3128)(p)
}

// healthy gives p a True Healthy condition for its current address, as the
// reconciler writes it (status.ip is the endpoint host for External).
func healthy(p *v1alpha1.Proxy) {
	p.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}}
	if p.IsExternal() {
		p.Status.IP = p.Spec.Endpoint.Host
	}
}

func TestMembers(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name string
		in   v1alpha1.Proxy
		want *pool.MemberHealth // nil: not a member
	}{
		{
			name: "an external healthy proxy is an http member with its attributes and latency",
			in: *gen.Proxy("a", inCrawl, func(p *v1alpha1.Proxy) {
				healthy(p)
				p.Spec.Attributes = map[string]string{"region": "eu"}
				p.Status.LatencyMillis = 30
			}),
			want: &pool.MemberHealth{Healthy: true, Latency: 30 * time.Millisecond},
		},
		{
			name: "no Healthy condition is unhealthy",
			in:   *gen.Proxy("a", inCrawl, nil),
			want: &pool.MemberHealth{Healthy: false},
		},
		{
			name: "Healthy False is unhealthy",
			in: *gen.Proxy("a", inCrawl, func(p *v1alpha1.Proxy) {
				p.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionFalse}}
			}),
			want: &pool.MemberHealth{Healthy: false},
		},
		{
			name: "a managed proxy without an ip yet is not a member",
			in: *gen.Proxy("a", inCrawl, func(p *v1alpha1.Proxy) {
				p.Spec = v1alpha1.ProxySpec{Mode: v1alpha1.ModeManaged, Provider: "k8s"}
				healthy(p)
			}),
		},
		{
			name: "a proxy being deleted is not a member",
			in: *gen.Proxy("a", inCrawl, func(p *v1alpha1.Proxy) {
				healthy(p)
				p.DeletionTimestamp = &now
			}),
		},
		{
			name: "a verdict for the old host of an edited endpoint is unhealthy",
			in: *gen.Proxy("a", inCrawl, func(p *v1alpha1.Proxy) {
				healthy(p)
				p.Spec.Endpoint.Host = "10.0.0.2"
			}),
			want: &pool.MemberHealth{Healthy: false},
		},
		{
			name: "a negative latency counts as unknown",
			in: *gen.Proxy("a", inCrawl, func(p *v1alpha1.Proxy) {
				healthy(p)
				p.Status.LatencyMillis = -5
			}),
			want: &pool.MemberHealth{Healthy: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Members([]v1alpha1.Proxy{tt.in}, nil)
			if tt.want == nil {
				if len(got) != 0 {
					t.Fatalf("members = %+v, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("members = %+v, want one", got)
			}
			m := got[0]
			if m.Name != "crawl/a" || m.URL.String() != "http://"+tt.in.Address() || m.Direct() {
				t.Fatalf("member %s at %v, want crawl/a at http://%s", m.Name, m.URL, tt.in.Address())
			}
			if m.Healthy != tt.want.Healthy || m.Latency != tt.want.Latency {
				t.Fatalf("healthy %v latency %s, want %v %s", m.Healthy, m.Latency, tt.want.Healthy, tt.want.Latency)
			}
			for k, v := range tt.in.Spec.Attributes {
				if m.Attributes[k] != v {
					t.Fatalf("attributes %v, want %v", m.Attributes, tt.in.Spec.Attributes)
				}
			}
		})
	}
}

func TestMembersManagedUsesStatusIPAndSpecPort(t *testing.T) {
	p := *gen.Proxy("m", inCrawl, func(p *v1alpha1.Proxy) {
		p.Spec = v1alpha1.ProxySpec{Mode: v1alpha1.ModeManaged, Provider: "k8s", Port: 8080}
		p.Status.IP = "fd00::7"
		healthy(p)
	})
	got := Members([]v1alpha1.Proxy{p}, nil)
	if len(got) != 1 || got[0].URL.String() != "http://[fd00::7]:8080" {
		t.Fatalf("members = %+v, want http://[fd00::7]:8080", got)
	}
}

func TestMembersAreSortedAndOwnTheirAttributes(t *testing.T) {
	attrs := map[string]string{"region": "eu"}
	in := []v1alpha1.Proxy{
		*gen.Proxy("c", inCrawl, nil),
		*gen.Proxy("a", inCrawl, func(p *v1alpha1.Proxy) { p.Spec.Attributes = attrs }),
		*gen.Proxy("b", inCrawl, func(p *v1alpha1.Proxy) { p.Namespace = "alpha" }),
	}
	got := Members(in, nil)
	var gotNames []string
	for _, m := range got {
		gotNames = append(gotNames, m.Name)
	}
	if want := []string{"alpha/b", "crawl/a", "crawl/c"}; !slices.Equal(gotNames, want) {
		t.Fatalf("names %v, want %v", gotNames, want)
	}
	got[1].Attributes["region"] = "us"
	if attrs["region"] != "eu" {
		t.Fatal("a member shares its attribute map with the cached Proxy")
	}
}

func TestSameAndDiffMembers(t *testing.T) {
	base := Members([]v1alpha1.Proxy{
		*gen.Proxy("a", inCrawl, healthy),
		*gen.Proxy("b", inCrawl, nil),
	}, nil)
	tests := []struct {
		name                    string
		next                    []v1alpha1.Proxy
		same                    bool
		added, removed, flipped []string
	}{
		{name: "identical", next: []v1alpha1.Proxy{*gen.Proxy("a", inCrawl, healthy), *gen.Proxy("b", inCrawl, nil)}, same: true},
		{name: "a health flip", next: []v1alpha1.Proxy{*gen.Proxy("a", inCrawl, nil), *gen.Proxy("b", inCrawl, nil)}, flipped: []string{"crawl/a"}},
		{name: "an added and a removed proxy", next: []v1alpha1.Proxy{*gen.Proxy("a", inCrawl, healthy), *gen.Proxy("c", inCrawl, nil)},
			added: []string{"crawl/c"}, removed: []string{"crawl/b"}},
		{name: "a latency change", next: []v1alpha1.Proxy{
			*gen.Proxy("a", inCrawl, func(p *v1alpha1.Proxy) { healthy(p); p.Status.LatencyMillis = 9 }), *gen.Proxy("b", inCrawl, nil)}},
		{name: "an attribute change", next: []v1alpha1.Proxy{
			*gen.Proxy("a", inCrawl, func(p *v1alpha1.Proxy) { healthy(p); p.Spec.Attributes = map[string]string{"x": "y"} }), *gen.Proxy("b", inCrawl, nil)}},
		{name: "an endpoint change", next: []v1alpha1.Proxy{
			*gen.Proxy("a", inCrawl, func(p *v1alpha1.Proxy) { healthy(p); p.Spec.Endpoint.Port = 3129 }), *gen.Proxy("b", inCrawl, nil)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := Members(tt.next, nil)
			if got := sameMembers(base, next); got != tt.same {
				t.Fatalf("sameMembers = %v, want %v", got, tt.same)
			}
			added, removed, flipped := diffMembers(base, next)
			if !slices.Equal(added, tt.added) || !slices.Equal(removed, tt.removed) || !slices.Equal(flipped, tt.flipped) {
				t.Fatalf("diff = +%v -%v ~%v, want +%v -%v ~%v", added, removed, flipped, tt.added, tt.removed, tt.flipped)
			}
		})
	}
}

func TestLogNamesIsBounded(t *testing.T) {
	var many []string
	for i := range 25 {
		many = append(many, string(rune('a'+i)))
	}
	got := logNames(many)
	if len(got) != maxLoggedNames+1 || got[maxLoggedNames] != "... 15 more" {
		t.Fatalf("logNames = %v", got)
	}
	if few := logNames(many[:3]); !slices.Equal(few, many[:3]) {
		t.Fatalf("logNames of 3 = %v", few)
	}
}

func TestMembersTakeTheirURLFromURLFunc(t *testing.T) {
	in := []v1alpha1.Proxy{*gen.Proxy("login", inCrawl, healthy), *gen.Proxy("broken", inCrawl, healthy), *gen.Proxy("withheld", inCrawl, healthy)}
	got := Members(in, func(p *v1alpha1.Proxy) (*url.URL, error) {
		switch p.Name {
		case "login":
			return &url.URL{Scheme: "socks5", User: url.UserPassword("u", "p"), Host: p.Address()}, nil
		case "broken":
			return nil, errors.New("credentials Secret crawl/x not found")
		}
		return nil, ErrWithheld
	})
	if len(got) != 2 {
		t.Fatalf("members %+v, want the withheld Proxy left out", got)
	}
	broken, login := got[0], got[1]
	if login.URL.String() != "socks5://u:p@10.0.0.1:3128" || !login.Healthy {
		t.Fatalf("login member %s healthy=%v, want socks5://u:p@10.0.0.1:3128, healthy", login.Redacted(), login.Healthy)
	}
	if broken.URL.String() != "http://10.0.0.1:3128" || broken.Healthy {
		t.Fatalf("a Proxy whose login cannot be read: %s healthy=%v, want its bare address, unhealthy", broken.Redacted(), broken.Healthy)
	}
}
