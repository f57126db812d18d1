package rotation

import "time"

// Candidate is one eligible member as the selection sees it: the key Less
// orders by. pool.Store keeps its members ordered by it in an index rather
// than comparing them all per lease.
type Candidate struct {
	Name string
	// Active is the member's unexpired lease count.
	Active int
	// LastChosen is the store's choice sequence number when the member was
	// last picked; 0 means never. Smaller is longer ago.
	LastChosen uint64
	// Latency is the last probe round trip; 0 means unknown.
	Latency time.Duration
}

// Less orders candidates best first: fewest active leases, then least
// recently chosen (so per-request rotation cycles through every member),
// then lowest known latency (unknown sorts after any known latency), then
// name, so the order is total and deterministic.
func Less(a, b Candidate) bool {
	if a.Active != b.Active {
		return a.Active < b.Active
	}
	if a.LastChosen != b.LastChosen {
		return a.LastChosen < b.LastChosen
	}
	if a.Latency != b.Latency {
		switch {
		case a.Latency <= 0:
			return false
		case b.Latency <= 0:
			return true
		}
		return a.Latency < b.Latency
	}
	return a.Name < b.Name
}
