// Package poll owns the one way the tests wait for a condition instead of
// sleeping: Until (fail the test) and Wait (return the error, for helpers
// and programs without a testing.TB) call a condition until it reports
// nil or a deadline passes, and the failure says what was awaited and the
// condition's last reason.
//
// It imports the standard library only and must not import anything of
// ours, so every test package can use it, including the internal tests of
// packages that internal/testutil (or what it imports) depends on.
package poll

import (
	"fmt"
	"testing"
	"time"
)

// DefaultInterval is how long Until and Wait sleep between two calls of a
// condition unless Every says otherwise: short enough that a test does not
// wait long after the condition holds, long enough not to spin a core.
const DefaultInterval = 25 * time.Millisecond

// Option changes how one Until or Wait polls.
type Option func(*settings)

type settings struct {
	interval time.Duration
	report   func() string
}

// Every sets the sleep between two calls of the condition: shorter to catch
// a short-lived state or to keep a latency-sensitive test quick, longer for
// a condition that is expensive to check (a guest's console, a VM list).
func Every(d time.Duration) Option {
	return func(s *settings) { s.interval = d }
}

// Report adds fn's text to the failure message: a diagnosis worth
// gathering only when the wait has failed (logs, a console, a listing).
func Report(fn func() string) Option {
	return func(s *settings) { s.report = fn }
}

// Wait calls cond until it returns nil or timeout passes. cond's error is
// the reason the condition is not met yet; on timeout Wait returns an error
// naming what was awaited and wrapping the last reason. It never sleeps
// after a success and always calls cond at least once.
func Wait(timeout time.Duration, what string, cond func() error, opts ...Option) error {
	s := settings{interval: DefaultInterval}
	for _, o := range opts {
		o(&s)
	}
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			if s.report != nil {
				return fmt.Errorf("timed out after %s waiting for %s; last: %w\n%s", timeout, what, err, s.report())
			}
			return fmt.Errorf("timed out after %s waiting for %s; last: %w", timeout, what, err)
		}
		time.Sleep(s.interval)
	}
}

// Until is Wait that fails the test (t.Fatal) on timeout. Call it from the
// test's goroutine, as t.Fatal requires.
func Until(t testing.TB, timeout time.Duration, what string, cond func() error, opts ...Option) {
	t.Helper()
	if err := Wait(timeout, what, cond, opts...); err != nil {
		t.Fatal(err)
	}
}

// Check is the reason a boolean condition is not met yet: nil when ok,
// else an error of format and args, which should describe the state seen
// ("2 reloads, want 1"), so that a timeout says how far things got.
func Check(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}
