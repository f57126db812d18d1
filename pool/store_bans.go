package pool

import (
	"context"
	"time"
)

// RecentBans lists the ban and rate-limit cooldowns of current members for
// one site each (not the every-site windows of upstream failures), that
// ran at some time within the last window: those running now, and those
// that ended less than window ago, which the store still remembers for
// Cooldown.Max after they end. Each {member, site} pair appears once, with
// the end of its latest window. A ProxyPool's recycling reads it to find
// members many sites have banned. Sorted by SortCooldowns; it never fails.
func (s *Store) RecentBans(_ context.Context, window time.Duration) ([]Cooldown, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	since := s.o.Clock.Now().Add(-max(window, 0))
	var out []Cooldown
	for _, ms := range s.order {
		for target, c := range ms.cool {
			if target != "" && c.reason.IsBan() && !c.until.Before(since) {
				out = append(out, Cooldown{Member: ms.m.Name, Target: target, Until: c.until, Reason: c.reason})
			}
		}
	}
	SortCooldowns(out)
	return out, nil
}
