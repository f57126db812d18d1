package gateway

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/link"
	"github.com/proxyfleet/proxyfleet/pool"
)

// memberLinks is the stage that reaches members: the gateway's state per
// member (its link, gateway/link: the keep-alive Transport, the lean
// path's pool, how to dial and authenticate to it), kept while the pool
// offers the member, and the connections through it (link.Dialer). A
// direct member's dial asks the admission stage (link.TargetChecker) for
// the target's checked addresses; it calls no later stage.
type memberLinks struct {
	dialer *link.Dialer

	mu      sync.RWMutex
	members map[string]*link.Link
}

func newMemberLinks(o Options, targets link.TargetChecker) *memberLinks {
	return &memberLinks{dialer: link.NewDialer(o.DialTimeout, o.MemberAnswerTimeout, o.SiteRoots, targets),
		members: make(map[string]*link.Link)}
}

// dialConnect and dialMember are the exchange's dials (linkDialer).
func (ml *memberLinks) dialConnect(ctx context.Context, mc *link.Link, hostport, host string, port uint16, addrs []netip.Addr, answerTimeout time.Duration) (net.Conn, []byte, error) {
	return ml.dialer.DialConnect(ctx, mc, hostport, host, port, addrs, answerTimeout)
}

func (ml *memberLinks) dialMember(ctx context.Context, mc *link.Link) (net.Conn, error) {
	return ml.dialer.DialMember(ctx, mc)
}

// closeAll closes every member's idle connections (Shutdown).
func (ml *memberLinks) closeAll() {
	ml.mu.Lock()
	for _, mc := range ml.members {
		mc.Close()
	}
	ml.mu.Unlock()
}

// memberFor returns the state of m, creating it on first use and replacing
// it when the member's endpoint changed (a reload under the same name).
func (ml *memberLinks) memberFor(m pool.Member) (*link.Link, error) {
	ml.mu.RLock()
	mc := ml.members[m.Name]
	ml.mu.RUnlock()
	if mc != nil && mc.Member.SameEndpoint(m) {
		mc.Touch()
		return mc, nil
	}
	l, err := ml.dialer.Open(m)
	if err != nil {
		return nil, err
	}
	nmc := l
	ml.mu.Lock()
	if cur := ml.members[m.Name]; cur != nil && cur.Member.SameEndpoint(m) {
		ml.mu.Unlock()
		nmc.Close()
		cur.Touch()
		return cur, nil
	} else if cur != nil {
		cur.Close()
	}
	nmc.Touch()
	ml.members[m.Name] = nmc
	ml.mu.Unlock()
	return nmc, nil
}

// memberByName returns the known state of a pinned member, nil when the
// gateway has none (never used, or forgotten).
func (ml *memberLinks) memberByName(name string) *link.Link {
	ml.mu.RLock()
	mc := ml.members[name]
	ml.mu.RUnlock()
	if mc != nil {
		mc.Touch()
	}
	return mc
}

// forget drops the gateway's state for a member removed from the pool
// and closes its idle keep-alive connections. Pins to it are abandoned: the
// next request of those sessions leases afresh. Open tunnels are untouched.
func (ml *memberLinks) forget(name string) {
	ml.mu.Lock()
	mc := ml.members[name]
	delete(ml.members, name)
	ml.mu.Unlock()
	if mc != nil {
		mc.Close()
	}
}

// forgetIdle forgets (as forget does) every member no request
// has taken for longer than idle, and returns their names. A gateway whose
// members come from a remote lease API never hears that one left the pool,
// so without this its per-member state would only grow; a member still in
// the pool is simply set up again on its next use.
func (ml *memberLinks) forgetIdle(idle time.Duration) []string {
	cutoff := time.Now().Add(-idle).UnixNano()
	var gone []*link.Link
	ml.mu.Lock()
	for name, mc := range ml.members {
		if mc.LastUsed.Load() < cutoff {
			delete(ml.members, name)
			gone = append(gone, mc)
		}
	}
	ml.mu.Unlock()
	names := make([]string, len(gone))
	for i, mc := range gone {
		mc.Close()
		names[i] = mc.Member.Name
	}
	return names
}
