package providerhealth

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/proxyfleet/proxyfleet/providers"
)

// scriptedChecker is a provider whose Check returns whatever the test set
// last: the test double for a backend that fails and recovers on cue (the
// Monitor is what is under test). With block set, Check waits for the
// channel (or, when honourCtx, for ctx) before answering.
type scriptedChecker struct {
	mu        sync.Mutex
	targets   []providers.TargetStatus
	calls     int
	block     chan struct{}
	honourCtx bool
	started   chan struct{} // receives once per Check call when non-nil
}

func (c *scriptedChecker) set(ts ...providers.TargetStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.targets = ts
}

func (c *scriptedChecker) callCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

func (c *scriptedChecker) Check(ctx context.Context) []providers.TargetStatus {
	c.mu.Lock()
	c.calls++
	block, honour, started := c.block, c.honourCtx, c.started
	ts := append([]providers.TargetStatus(nil), c.targets...)
	c.mu.Unlock()
	if started != nil {
		started <- struct{}{}
	}
	if block != nil {
		if honour {
			select {
			case <-block:
			case <-ctx.Done():
				return []providers.TargetStatus{{Target: "api", Reason: ReasonTimeout, Message: ctx.Err().Error()}}
			}
		} else {
			<-block
		}
	}
	return ts
}

func (c *scriptedChecker) Create(context.Context, providers.CreateRequest) (providers.Instance, error) {
	return providers.Instance{}, errors.New("scriptedChecker: not a real backend")
}
func (c *scriptedChecker) Get(context.Context, string) (providers.Instance, error) {
	return providers.Instance{}, errors.New("scriptedChecker: not a real backend")
}
func (c *scriptedChecker) Delete(context.Context, string) error {
	return errors.New("scriptedChecker: not a real backend")
}
func (c *scriptedChecker) ListByTag(context.Context) ([]providers.Instance, error) {
	return nil, errors.New("scriptedChecker: not a real backend")
}

// noCheck is a provider without a Checker.
type noCheck struct{}

func (noCheck) Create(context.Context, providers.CreateRequest) (providers.Instance, error) {
	return providers.Instance{}, nil
}
func (noCheck) Get(context.Context, string) (providers.Instance, error) {
	return providers.Instance{}, nil
}
func (noCheck) Delete(context.Context, string) error                    { return nil }
func (noCheck) ListByTag(context.Context) ([]providers.Instance, error) { return nil, nil }

// newMonitor is New for options a test knows to be valid.
func newMonitor(t *testing.T, o Options) *Monitor {
	t.Helper()
	m, err := New(o)
	if err != nil {
		t.Fatalf("providerhealth.New: %v", err)
	}
	return m
}
