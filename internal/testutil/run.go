package testutil

import (
	"context"
	"testing"
	"time"
)

// RunUntilCleanup runs start (a manager, a runnable's Start) in a goroutine
// with a context that is cancelled when the test ends or when the returned
// stop is called. stop waits up to wait for start to return and fails the
// test if it returned an error or did not return in time. stop is idempotent.
func RunUntilCleanup(t testing.TB, name string, wait time.Duration, start func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s stopped with %v", name, err)
			}
		case <-time.After(wait):
			t.Errorf("%s did not stop within %s", name, wait)
		}
	}
	t.Cleanup(stop)
	return stop
}
