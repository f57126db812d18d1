package keyedlock

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestOneHolderPerKeyAndKeysIndependent(t *testing.T) {
	var l Locks
	var inA, maxA atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock, err := l.Lock(context.Background(), "a")
			if err != nil {
				t.Error(err)
				return
			}
			n := inA.Add(1)
			for {
				m := maxA.Load()
				if n <= m || maxA.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			inA.Add(-1)
			unlock()
		}()
	}
	// While "a" is contended, "b" is taken at once.
	unlockB, err := l.Lock(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	unlockB()
	wg.Wait()
	if maxA.Load() != 1 {
		t.Fatalf("%d holders of one key at once, want 1", maxA.Load())
	}
	if l.Len() != 0 {
		t.Fatalf("%d slots left after every holder released, want 0", l.Len())
	}
}

func TestWaitEndsWithTheContextAndHoldsNothing(t *testing.T) {
	var l Locks
	unlock, err := l.Lock(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, "k"); err != context.DeadlineExceeded {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
	unlock()
	unlock() // a second call is harmless
	if l.Len() != 0 {
		t.Fatalf("%d slots left, want 0", l.Len())
	}
	again, err := l.Lock(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	again()
}

func TestTryLockTakesOnlyAFreeSlotAndNeverWaits(t *testing.T) {
	var l Locks
	unlock, ok := l.TryLock("k")
	if !ok {
		t.Fatal("TryLock of a free key failed")
	}
	if _, ok := l.TryLock("k"); ok {
		t.Fatal("TryLock of a held key succeeded")
	}
	other, ok := l.TryLock("other")
	if !ok {
		t.Fatal("TryLock of another key failed")
	}
	other()
	unlock()
	if l.Len() != 0 {
		t.Fatalf("%d slots left, want 0", l.Len())
	}
	again, ok := l.TryLock("k")
	if !ok {
		t.Fatal("TryLock after the unlock failed")
	}
	again()
}
