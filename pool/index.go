package pool

import (
	"container/heap"

	"github.com/proxyfleet/proxyfleet/rotation"
)

// selectionIndex keeps the members that can be chosen for some target
// (current, healthy, not cooling down for every target) ordered by
// rotation.Less on their selection keys, so that Acquire finds the best
// eligible member without comparing every member. It is a mechanism of the
// Store: the order is rotation.Less, and whether a member may be leased is
// Store.judge; the index only decides which members Acquire looks at and in
// what order.
//
// Every indexed member is in the heap of all members, and in one heap per
// attribute pair it carries whose heap exists. Pair heaps are built the first
// time a selector uses the pair and kept up to date from then on, so members'
// attributes cost nothing until some request selects on them; a pair's heap
// is dropped when no current member carries the pair any more, which bounds
// them by the pairs in the member set, whatever selectors clients send.
//
// Why binary heaps and not an ordered tree: an acquire or release changes one
// member's key, which a heap repairs in place (heap.Fix) with a few
// comparisons; the common case (the best member is taken, or a released one
// is the most recently chosen) moves it one way only. Finding the best member
// that passes a test is a pruned walk from the root (best), which visits only
// members that rank above the answer and fail the test, plus their children.
type selectionIndex struct {
	all    memberHeap
	byAttr map[attrPair]*memberHeap
	// carried counts the current members (indexed or not) with each
	// attribute pair: a selector pair nobody carries matches no member, and
	// a pair heap is dropped when its count reaches zero.
	carried map[attrPair]int
	stack   []int // scratch for best, reused across calls
}

// attrPair is one attribute key=value, what a selector pair matches.
type attrPair struct{ k, v string }

func newSelectionIndex() *selectionIndex {
	return &selectionIndex{byAttr: map[attrPair]*memberHeap{}, carried: map[attrPair]int{}}
}

// count records that ms became a current member (delta 1) or stopped being
// one (delta -1). ms must not be indexed when it stops.
func (x *selectionIndex) count(ms *memberState, delta int) {
	for k, v := range ms.m.Attributes {
		p := attrPair{k, v}
		n := x.carried[p] + delta
		if n > 0 {
			x.carried[p] = n
			continue
		}
		delete(x.carried, p)
		delete(x.byAttr, p) // empty: every member carrying p is unindexed
	}
}

// carries reports whether every pair of sel is carried by some current
// member; when not, sel matches no member at all.
func (x *selectionIndex) carries(sel map[string]string) bool {
	for k, v := range sel {
		if x.carried[attrPair{k, v}] == 0 {
			return false
		}
	}
	return true
}

// add indexes ms, which must not be indexed yet.
func (x *selectionIndex) add(ms *memberState) {
	x.all.push(ms)
	for k, v := range ms.m.Attributes {
		if h := x.byAttr[attrPair{k, v}]; h != nil {
			h.push(ms)
		}
	}
}

// drop unindexes ms; a member that is not indexed is left alone.
func (x *selectionIndex) drop(ms *memberState) {
	for _, n := range ms.nodes {
		n.h.remove(n)
	}
	clear(ms.nodes)
	ms.nodes = ms.nodes[:0]
}

// rekeyed restores the heaps' order after ms.key changed.
func (x *selectionIndex) rekeyed(ms *memberState) {
	for _, n := range ms.nodes {
		n.h.e[n.i].key = ms.key
		heap.Fix(n.h, n.i)
	}
}

// best returns the best member by rotation.Less among the indexed members
// matching sel for which ok is true, or nil. It walks the smallest heap of
// sel's pairs (building missing ones), so ok must still check the whole
// selector. When it returns nil, ok has seen every indexed member matching
// sel, unless a pair of sel is carried by no current member (carries).
func (x *selectionIndex) best(sel map[string]string, ok func(*memberState) bool) *memberState {
	h := &x.all
	for k, v := range sel {
		p := attrPair{k, v}
		ph := x.byAttr[p]
		if ph == nil {
			if x.carried[p] == 0 {
				return nil
			}
			ph = x.build(p)
		}
		if ph.Len() < h.Len() {
			h = ph
		}
	}
	var found *memberState
	found, x.stack = h.best(ok, x.stack)
	return found
}

// build makes the heap of the indexed members carrying p.
func (x *selectionIndex) build(p attrPair) *memberHeap {
	h := &memberHeap{}
	for _, e := range x.all.e {
		if v, ok := e.n.ms.m.Attributes[p.k]; ok && v == p.v {
			n := &heapNode{ms: e.n.ms, h: h, i: len(h.e)}
			h.e = append(h.e, heapEntry{key: e.key, n: n})
			n.ms.nodes = append(n.ms.nodes, n)
		}
	}
	heap.Init(h)
	x.byAttr[p] = h
	return h
}

// memberHeap is a binary min-heap of members by rotation.Less over their
// keys. It implements heap.Interface; each member's heapNode tracks its
// position so that a key change or a removal costs O(log n). Each entry
// holds a copy of its member's key (rekeyed refreshes it), so comparisons
// read the heap's own array instead of following a pointer per member:
// at 10,000 members that cut the cost of restoring the order by a quarter.
type memberHeap struct{ e []heapEntry }

// heapEntry is one member in a memberHeap: its key and its node.
type heapEntry struct {
	key rotation.Candidate
	n   *heapNode
}

// heapNode is one member's place in one memberHeap.
type heapNode struct {
	ms *memberState
	h  *memberHeap
	i  int
}

func (h *memberHeap) Len() int           { return len(h.e) }
func (h *memberHeap) Less(i, j int) bool { return rotation.Less(h.e[i].key, h.e[j].key) }
func (h *memberHeap) Swap(i, j int) {
	h.e[i], h.e[j] = h.e[j], h.e[i]
	h.e[i].n.i = i
	h.e[j].n.i = j
}
func (h *memberHeap) Push(x any) {
	e := x.(heapEntry)
	e.n.i = len(h.e)
	h.e = append(h.e, e)
}
func (h *memberHeap) Pop() any {
	e := h.e[len(h.e)-1]
	h.e[len(h.e)-1] = heapEntry{}
	h.e = h.e[:len(h.e)-1]
	return e
}

// push adds ms to h and records the node in ms.nodes.
func (h *memberHeap) push(ms *memberState) {
	n := &heapNode{ms: ms, h: h}
	ms.nodes = append(ms.nodes, n)
	heap.Push(h, heapEntry{key: ms.key, n: n})
}

// remove takes n out of h.
func (h *memberHeap) remove(n *heapNode) {
	heap.Remove(h, n.i)
}

// best returns the least member by rotation.Less for which ok is true, or
// nil. A heap's children never rank above their parent, so the walk stops
// descending at a member that passes ok (its subtree ranks below it) and
// skips any member that does not rank above the best found so far. When it
// returns nil it has called ok on every member of h exactly once, which
// Acquire relies on to count a refusal. It takes and returns a scratch stack
// so that Acquire does not allocate.
func (h *memberHeap) best(ok func(*memberState) bool, stack []int) (*memberState, []int) {
	found := -1
	if len(h.e) == 0 {
		return nil, stack
	}
	stack = append(stack[:0], 0)
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if found >= 0 && !h.Less(i, found) {
			continue
		}
		if ok(h.e[i].n.ms) {
			found = i
			continue
		}
		l, r := 2*i+1, 2*i+2
		switch {
		case r < len(h.e) && h.Less(r, l):
			stack = append(stack, l, r) // the better child is walked first
		case r < len(h.e):
			stack = append(stack, r, l)
		case l < len(h.e):
			stack = append(stack, l)
		}
	}
	if found < 0 {
		return nil, stack
	}
	return h.e[found].n.ms, stack
}
