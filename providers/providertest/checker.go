package providertest

import (
	"context"
	"slices"
	"sync"

	"github.com/proxyfleet/proxyfleet/providers"
)

// Checker is Provider with a scripted providers.Checker: Check answers the
// statuses Set last, counts its calls and can be held in flight, for the
// provider health monitor's tests. A provider without a health check is a
// plain Provider, which has no Check method.
type Checker struct {
	*Provider

	mu       sync.Mutex
	targets  []providers.TargetStatus
	checks   int
	block    chan struct{}
	onCancel func(error) []providers.TargetStatus
	started  chan struct{}
	onCheck  func(context.Context)
}

// NewChecker returns a Checker over a New backend whose Check answers ts.
func NewChecker(ts ...providers.TargetStatus) *Checker {
	return &Checker{Provider: New(), targets: ts}
}

// Set makes the following Checks answer ts.
func (c *Checker) Set(ts ...providers.TargetStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.targets = ts
}

// Checks returns how many times Check was called.
func (c *Checker) Checks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checks
}

// Block makes the following Checks wait until release is closed (nil: do
// not wait). With onCancel nil a held Check ignores its context, as a hung
// backend call would; otherwise a cancelled context ends it with
// onCancel(ctx.Err())'s statuses.
func (c *Checker) Block(release chan struct{}, onCancel func(error) []providers.TargetStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.block, c.onCancel = release, onCancel
}

// Started makes every Check send on ch as it begins, so a test knows a
// round is in flight.
func (c *Checker) Started(ch chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started = ch
}

// OnCheck makes fn run at the start of every Check with Check's context, as
// a backend's client would use it (to start a span of its own).
func (c *Checker) OnCheck(fn func(context.Context)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onCheck = fn
}

// Check answers the scripted statuses, held as Block says.
func (c *Checker) Check(ctx context.Context) []providers.TargetStatus {
	c.mu.Lock()
	c.checks++
	block, onCancel, started, hook := c.block, c.onCancel, c.started, c.onCheck
	ts := slices.Clone(c.targets)
	c.mu.Unlock()
	if hook != nil {
		hook(ctx)
	}
	if started != nil {
		started <- struct{}{}
	}
	if block == nil {
		return ts
	}
	if onCancel == nil {
		<-block
		return ts
	}
	select {
	case <-block:
		return ts
	case <-ctx.Done():
		return onCancel(ctx.Err())
	}
}
