package pool

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

func TestStoreSetMembersHealth(t *testing.T) {
	s, clk := newTestStore(t, StoreOptions{})
	a, b := proxyMember(t, "a", "region", "eu"), proxyMember(t, "b", "region", "eu")
	b.URL = &url.URL{Scheme: "http", Host: "127.0.0.2:3128"}

	t.Run("a new unhealthy member is never offered", func(t *testing.T) {
		s.SetMembersHealth([]MemberHealth{
			{Member: a, Healthy: true, Latency: 20 * time.Millisecond},
			{Member: b, Healthy: false},
		})
		for range 3 {
			l := mustAcquire(t, s, AcquireRequest{Target: "example.com"})
			if l.Member.Name != "a" {
				t.Fatalf("leased %s, want only the healthy a", l.Member.Name)
			}
			_ = s.Release(context.Background(), l.ID)
		}
		st := s.Members()
		if len(st) != 2 || !st[0].Healthy || st[0].Latency != 20*time.Millisecond || st[1].Healthy {
			t.Fatalf("members = %+v, want a healthy at 20ms and b unhealthy", st)
		}
	})

	t.Run("unhealthy members count in the no-match body", func(t *testing.T) {
		s.SetMembersHealth([]MemberHealth{{Member: a, Healthy: false}, {Member: b, Healthy: false}})
		_, err := s.Acquire(context.Background(), AcquireRequest{Selector: map[string]string{"region": "eu"}})
		if nm := noMatch(t, err); nm.Considered != 2 || nm.Unhealthy != 2 {
			t.Fatalf("no match = %+v, want 2 considered, 2 unhealthy", nm)
		}
	})

	t.Run("a kept member keeps its cooldowns across updates", func(t *testing.T) {
		s.SetMembersHealth([]MemberHealth{{Member: a, Healthy: true}})
		l := mustAcquire(t, s, AcquireRequest{Target: "example.com"})
		mustReport(t, s, l.ID, Report{Result: rotation.ResultRateLimited})
		s.SetMembersHealth([]MemberHealth{{Member: a, Healthy: true, Latency: time.Millisecond}, {Member: b, Healthy: true}})
		clk.Step(time.Second)
		got := mustAcquire(t, s, AcquireRequest{Target: "example.com"})
		if got.Member.Name != "b" {
			t.Fatalf("leased %s for the target a is cooling down for, want b", got.Member.Name)
		}
	})

	t.Run("the first of duplicate names wins", func(t *testing.T) {
		s.SetMembersHealth([]MemberHealth{{Member: a, Healthy: true}, {Member: a, Healthy: false}})
		if st := s.Members(); len(st) != 1 || !st[0].Healthy {
			t.Fatalf("members = %+v, want one healthy a", st)
		}
	})
}
