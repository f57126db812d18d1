// Package cloudfault scripts the faults the in-test cloud APIs (ec2api,
// doapi, hcloudapi, computeapi) answer with: an error before a call does
// anything, an error after it took effect (a create answered 500 although
// the instance was made), and no answer at all after it took effect (an
// answer lost on the way back). Each server holds a Script of its own
// error type (ec2api, doapi and hcloudapi embed it, honouring all three;
// computeapi offers Fail only) and asks it around every call, so a
// provider's tests script every cloud's failures the same way.
package cloudfault

import "sync"

// Script is a fault script keyed by the cloud's operation names. The zero
// value is an empty script; its methods are safe for concurrent use.
type Script[E any] struct {
	mu     sync.Mutex
	before map[string][]E
	after  map[string][]E
	hangs  map[string]int
}

// Fail queues errors the next calls of op answer with before doing
// anything, one call each.
func (s *Script[E]) Fail(op string, errs ...E) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.before == nil {
		s.before = map[string][]E{}
	}
	s.before[op] = append(s.before[op], errs...)
}

// FailAfter queues errors the next calls of op answer with after the call
// took effect, one call each.
func (s *Script[E]) FailAfter(op string, errs ...E) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.after == nil {
		s.after = map[string][]E{}
	}
	s.after[op] = append(s.after[op], errs...)
}

// HangAfter makes the next n calls of op take effect and then never
// answer, until the client gives up (its context ends) or the server
// closes.
func (s *Script[E]) HangAfter(op string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hangs == nil {
		s.hangs = map[string]int{}
	}
	s.hangs[op] += n
}

// Before takes the error a call of op answers with before doing anything,
// if one is queued.
func (s *Script[E]) Before(op string) (E, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return pop(s.before, op)
}

// After takes what a call of op that took effect answers instead of its
// answer: a queued FailAfter error first, else a HangAfter (hang true);
// neither when nothing is queued.
func (s *Script[E]) After(op string) (err *E, hang bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := pop(s.after, op); ok {
		return &e, false
	}
	if s.hangs[op] > 0 {
		s.hangs[op]--
		return nil, true
	}
	return nil, false
}

func pop[E any](q map[string][]E, op string) (E, bool) {
	var zero E
	errs := q[op]
	if len(errs) == 0 {
		return zero, false
	}
	q[op] = errs[1:]
	return errs[0], true
}
