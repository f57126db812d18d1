package poll

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestWaitReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	err := Wait(time.Minute, "the third call", func() error {
		calls++
		return Check(calls == 3, "call %d", calls)
	}, Every(time.Millisecond))
	if err != nil || calls != 3 {
		t.Fatalf("Wait = %v after %d calls, want nil after 3", err, calls)
	}
}

func TestWaitNamesWhatAndTheLastReason(t *testing.T) {
	calls := 0
	last := errors.New("")
	err := Wait(30*time.Millisecond, "the sky to fall", func() error {
		calls++
		last = errors.New("still up")
		return last
	}, Every(time.Millisecond), Report(func() string { return "sky report" }))
	if err == nil {
		t.Fatal("Wait = nil for a condition that never holds")
	}
	for _, want := range []string{"waiting for the sky to fall", "last: still up", "sky report", "30ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Wait's error %q lacks %q", err, want)
		}
	}
	if !errors.Is(err, last) {
		t.Errorf("Wait's error does not wrap the last reason")
	}
	if calls < 2 {
		t.Errorf("cond called %d times in 30ms at a 1ms interval", calls)
	}
}

func TestEveryShrinksTheInterval(t *testing.T) {
	calls := 0
	_ = Wait(100*time.Millisecond, "never", func() error { calls++; return errors.New("no") })
	slow := calls
	calls = 0
	_ = Wait(100*time.Millisecond, "never", func() error { calls++; return errors.New("no") }, Every(time.Millisecond))
	if calls <= 2*slow {
		t.Fatalf("%d calls at 1ms against %d at the default interval", calls, slow)
	}
}

func TestCheck(t *testing.T) {
	if err := Check(true, "x"); err != nil {
		t.Fatalf("Check(true) = %v", err)
	}
	if err := Check(false, "%d left", 2); err == nil || err.Error() != "2 left" {
		t.Fatalf("Check(false) = %v, want \"2 left\"", err)
	}
}
