package cloudfault

import "testing"

// TestAScriptAnswersEachQueuedFaultOnceInOrder: errors before a call, then
// errors after it, then hangs, each taken by one call of its operation
// only, in the order queued; another operation and an empty script answer
// nothing.
func TestAScriptAnswersEachQueuedFaultOnceInOrder(t *testing.T) {
	var s Script[string]
	if _, ok := s.Before("create"); ok {
		t.Fatal("an empty script failed a call")
	}
	if e, hang := s.After("create"); e != nil || hang {
		t.Fatal("an empty script changed a call's answer")
	}
	s.Fail("create", "throttled", "quota")
	s.FailAfter("create", "500")
	s.HangAfter("create", 1)
	for _, want := range []string{"throttled", "quota"} {
		if got, ok := s.Before("create"); !ok || got != want {
			t.Fatalf("Before: %q, %v; want %q", got, ok, want)
		}
	}
	if _, ok := s.Before("create"); ok {
		t.Fatal("Before answered more errors than were queued")
	}
	if _, ok := s.Before("delete"); ok {
		t.Fatal("another operation took create's fault")
	}
	if e, hang := s.After("create"); e == nil || *e != "500" || hang {
		t.Fatalf("After: %v, %v; want the 500 first", e, hang)
	}
	if e, hang := s.After("create"); e != nil || !hang {
		t.Fatalf("After: %v, %v; want the hang next", e, hang)
	}
	if e, hang := s.After("create"); e != nil || hang {
		t.Fatalf("After: %v, %v; want nothing once the script is spent", e, hang)
	}
}
