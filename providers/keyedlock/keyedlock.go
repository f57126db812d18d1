// Package keyedlock serialises work by key: one holder per key at a time,
// any number of keys at once. VM providers use it so two reconciles of the
// same instance name (or two Creates needing the same base image) never
// interleave their idempotent steps, while different names run in parallel.
//
// It imports the standard library only.
package keyedlock

import (
	"context"
	"sync"
)

// Locks is a set of one-slot semaphores created on demand and dropped when
// nobody holds or waits for them, so the set does not grow with every name
// ever seen. The zero value is ready to use.
type Locks struct {
	mu    sync.Mutex
	slots map[string]*slot
}

type slot struct {
	ch   chan struct{}
	refs int
}

// Lock waits for key's slot, or for ctx to end (then it returns ctx's error
// and holds nothing). The returned func releases the slot; call it once.
func (l *Locks) Lock(ctx context.Context, key string) (unlock func(), err error) {
	s := l.ref(key)
	select {
	case s.ch <- struct{}{}:
	case <-ctx.Done():
		l.drop(key, s)
		return nil, ctx.Err()
	}
	return l.releaser(key, s), nil
}

// TryLock takes key's slot when it is free and reports whether it did: a
// caller that would rather do something else than wait (a reconcile worker
// that must not sit behind a long download) does not queue.
func (l *Locks) TryLock(key string) (unlock func(), ok bool) {
	s := l.ref(key)
	select {
	case s.ch <- struct{}{}:
	default:
		l.drop(key, s)
		return nil, false
	}
	return l.releaser(key, s), true
}

// ref returns key's slot, made on demand, counted as held or waited for.
func (l *Locks) ref(key string) *slot {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.slots == nil {
		l.slots = map[string]*slot{}
	}
	s := l.slots[key]
	if s == nil {
		s = &slot{ch: make(chan struct{}, 1)}
		l.slots[key] = s
	}
	s.refs++
	return s
}

// releaser frees key's slot s once, however often it is called.
func (l *Locks) releaser(key string, s *slot) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			<-s.ch
			l.drop(key, s)
		})
	}
}

func (l *Locks) drop(key string, s *slot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.refs--
	if s.refs == 0 {
		delete(l.slots, key)
	}
}

// Len is the number of keys held or waited for, for tests.
func (l *Locks) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.slots)
}
