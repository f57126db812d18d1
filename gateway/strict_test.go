package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/fault"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/pool"
)

func TestStrictSessionIsLostWithItsMemberNeverMoved(t *testing.T) {
	members := directMembers(2)
	for _, how := range []string{"username", "header"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
			tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.178"})
			user, hdr := "crawler-session-cart1-strict-1", http.Header(nil)
			if how == "header" {
				user, hdr = "crawler", http.Header{HeaderSession: {"cart1"}, HeaderStrict: {"1"}}
			}
			c := e.client(user, "")
			resp, a := get(t, c, tg.URL(), hdr)
			if resp.StatusCode != 200 {
				t.Fatalf("first: %d", resp.StatusCode)
			}
			tg.SetRule(a.Source, http.StatusForbidden, nil)
			for i, want := range []string{"was banned by the site (403, banned)", "was lost earlier"} {
				resp, b := getText(t, c, tg.URL(), hdr)
				if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(HeaderReason) != fault.ReasonSessionLost || !strings.Contains(b, want) {
					t.Fatalf("request %d after the ban: %d %q %s, want 502 session_lost saying %q", i+2, resp.StatusCode, resp.Header.Get(HeaderReason), b, want)
				}
			}
			if n := tg.Total(); n != 2 {
				t.Fatalf("the site saw %d requests, want 2 (no other member tried)", n)
			}
			// Other sessions, and the same one no longer strict, go on.
			other := e.client("crawler-session-cart2", "")
			if resp, b := get(t, other, tg.URL(), nil); resp.StatusCode != 200 || b.Source == a.Source {
				t.Fatalf("a non-strict session: %d via %s", resp.StatusCode, b.Source)
			}
		})
	}
}

func TestStrictSessionWhoseMemberLeftIsLost(t *testing.T) {
	members := directMembers(2)
	e := newEnv(t, Options{AllowPrivateTargets: true}, pool.StoreOptions{}, members...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.179"})
	c := e.client("crawler-session-s-strict-1", "")
	_, a := get(t, c, tg.URL(), nil)
	var keep []pool.Member
	for _, m := range members {
		if sourceOf(m) != a.Source {
			keep = append(keep, m)
		}
	}
	e.store.SetMembers(keep)
	e.gw.ForgetMember(members[0].Name)
	e.gw.ForgetMember(members[1].Name)
	resp, b := getText(t, c, tg.URL(), nil)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(b, "left the pool") {
		t.Fatalf("%d %s, want 502 session_lost: left the pool", resp.StatusCode, b)
	}
}

// TestSessionsBeyondTheLimitAreRefusedAndNoLiveOneMoves: with room for two
// sticky sessions, a third is answered 503 session_limit without a member
// being leased, and the two live ones keep their members; a session that
// ends makes room again.
func TestSessionsBeyondTheLimitAreRefusedAndNoLiveOneMoves(t *testing.T) {
	e := newEnv(t, Options{AllowPrivateTargets: true, AffinityEntries: 2}, pool.StoreOptions{}, directMembers(2)...)
	tg := testutil.StartTarget(t, testutil.TargetOptions{Host: "127.0.0.177"})
	first := map[string]string{}
	for _, s := range []string{"a", "b"} {
		resp, ans := get(t, e.client("crawler-session-"+s+"-sessttl-2s", ""), tg.URL(), nil)
		if resp.StatusCode != 200 {
			t.Fatalf("session %s: %d", s, resp.StatusCode)
		}
		first[s] = ans.Source
	}
	seen := tg.Total()
	resp, body := getText(t, e.client("crawler-session-c", ""), tg.URL(), nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderReason) != fault.ReasonSessionLimit ||
		!strings.Contains(body, "limit of 2 live sticky sessions (--max-sessions)") {
		t.Fatalf("a third session: %d %q %s, want 503 session_limit naming the limit", resp.StatusCode, resp.Header.Get(HeaderReason), body)
	}
	if tg.Total() != seen {
		t.Fatal("the refused session's request reached the site")
	}
	leases := 0
	for _, m := range e.store.Members() {
		leases += m.ActiveLeases
	}
	if leases != 2 {
		t.Fatalf("the members hold %d leases, want the two live sessions' (the refused one's given back)", leases)
	}
	for s, src := range first {
		if _, ans := get(t, e.client("crawler-session-"+s+"-sessttl-2s", ""), tg.URL(), nil); ans.Source != src {
			t.Fatalf("session %s moved from %s to %s while the table was full", s, src, ans.Source)
		}
	}
	// Once the first two end (sessttl 2s), the third gets a member.
	poll.Until(t, 20*time.Second, "a member for the third session", func() error {
		resp, _ := getText(t, e.client("crawler-session-c", ""), tg.URL(), nil)
		if resp.StatusCode != 200 {
			return fmt.Errorf("the third session still gets %d %s", resp.StatusCode, resp.Header.Get(HeaderReason))
		}
		return nil
	})
}
