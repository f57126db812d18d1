package gateway

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/pool"
)

func TestMemberStateFollowsTheMembersEndpoint(t *testing.T) {
	g, err := New(Options{Pool: pool.NewStore(pool.StoreOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
	})
	member := func(raw string) pool.Member {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		return pool.Member{Name: "p", URL: u}
	}
	closed := func(mc *link.Link) bool { return mc.Lean.Closed() }

	first, err := g.links.memberFor(member("http://u:pw@127.0.0.1:3128"))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("the same endpoint parsed again reuses the state", func(t *testing.T) {
		again, err := g.links.memberFor(member("http://u:pw@127.0.0.1:3128"))
		if err != nil {
			t.Fatal(err)
		}
		if again != first {
			t.Fatal("a lease of an unchanged member built new state (and a new connection pool)")
		}
	})
	t.Run("a new password under the same name replaces the state", func(t *testing.T) {
		next, err := g.links.memberFor(member("http://u:new@127.0.0.1:3128"))
		if err != nil {
			t.Fatal(err)
		}
		if next == first {
			t.Fatal("the member's old credentials are still in use")
		}
		if !closed(first) {
			t.Fatal("the replaced member's connection pool was left open")
		}
		if g.links.memberByName("p") != next {
			t.Fatal("pins still resolve to the replaced state")
		}
		first = next
	})
	t.Run("a forgotten member's state is dropped and closed", func(t *testing.T) {
		g.ForgetMember("p")
		if g.links.memberByName("p") != nil {
			t.Fatal("a forgotten member still resolves for pins")
		}
		if !closed(first) {
			t.Fatal("the forgotten member's connection pool was left open")
		}
	})
}

func TestForgetIdleMembersDropsOnlyMembersNotUsedSince(t *testing.T) {
	g, err := New(Options{Pool: pool.NewStore(pool.StoreOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
	})
	member := func(name, raw string) pool.Member {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		return pool.Member{Name: name, URL: u}
	}
	idle, err := g.links.memberFor(member("idle", "http://127.0.0.1:3128"))
	if err != nil {
		t.Fatal(err)
	}
	busy, err := g.links.memberFor(member("busy", "http://127.0.0.1:3129"))
	if err != nil {
		t.Fatal(err)
	}
	// "idle" was last used an hour ago; "busy" is taken by a pin just now.
	idle.LastUsed.Store(time.Now().Add(-time.Hour).UnixNano())
	busy.LastUsed.Store(time.Now().Add(-time.Hour).UnixNano())
	if g.links.memberByName("busy") != busy {
		t.Fatal("busy member not found")
	}

	gone := g.ForgetIdleMembers(10 * time.Minute)
	if len(gone) != 1 || gone[0] != "idle" {
		t.Fatalf("forgot %v, want [idle]", gone)
	}
	if g.links.memberByName("idle") != nil {
		t.Fatal("the idle member still resolves")
	}
	if !idle.Lean.Closed() {
		t.Fatal("the idle member's connection pool was left open")
	}
	if g.links.memberByName("busy") != busy {
		t.Fatal("a member a pin used just now was forgotten")
	}
	// A forgotten member that is still in the pool is set up again on use.
	again, err := g.links.memberFor(member("idle", "http://127.0.0.1:3128"))
	if err != nil || again == idle {
		t.Fatalf("re-use after forgetting: %v (same state: %v)", err, again == idle)
	}
}
