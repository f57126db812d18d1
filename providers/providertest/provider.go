// Package providertest owns the one provider test double: Provider, an
// in-memory backend that keeps the provider contract (Create idempotent by
// name, Delete tolerant of gone instances, a deleted instance visible as
// Terminated for a few Gets before it is NotFound, Create refusing a name
// whose previous instance is still going away), records every call and can
// be told to fail any operation with any error class; and Checker, the same
// with a scripted health check. The reconciler, the orphan GC, the provider
// health monitor and the providers package's decorators are tested against
// it, so they meet the sequences they meet in production.
//
// It imports the providers package and the standard library only; it must
// not import a provider implementation, the controller or anything that
// starts real parts (internal/testutil), so that any test can use it.
package providertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/providers"
)

// Provider is the in-memory provider. The zero value is not ready; use New.
// Every method is safe for concurrent use.
type Provider struct {
	mu        sync.Mutex
	instances map[string]*providers.Instance // by providerID
	order     []string                       // providerIDs in the order they appeared, for ListByTag
	// deleting counts the Gets left before a deleted instance disappears.
	deleting map[string]int
	calls    []Call
	failures map[string][]error // op → errors to return, front first
	sticky   map[string]error   // op → error returned until cleared
	byID     map[string]error   // providerID → error its Deletes fail with
	// startState is the state a new instance starts in.
	startState providers.State
	// deleteGets is how many Gets see a deleted instance before NotFound.
	deleteGets int
	nextIP     int
	onCreate   func(providers.CreateRequest)
	answer     func(providers.CreateRequest, error) providers.Instance
}

// Call is one recorded provider call.
type Call struct {
	Op  string                  // providers.OpCreate, OpGet, OpDelete or OpList
	Arg string                  // instance name for a Create, providerID otherwise
	Req providers.CreateRequest // a Create's request
	Err error                   // what the call returned
	At  time.Time
}

// New returns an empty backend whose new instances start Running and whose
// deleted instances are seen by two more Gets before they are NotFound.
func New() *Provider {
	return &Provider{
		instances:  map[string]*providers.Instance{},
		deleting:   map[string]int{},
		failures:   map[string][]error{},
		sticky:     map[string]error{},
		byID:       map[string]error{},
		startState: providers.StateRunning,
		deleteGets: 2,
	}
}

// NewWith is New holding insts, as Put stores them.
func NewWith(insts ...providers.Instance) *Provider {
	f := New()
	f.Put(insts...)
	return f
}

// ErrClass builds an error of the given class, as a provider would wrap it.
func ErrClass(class error, what string) error {
	return fmt.Errorf("%w: fake backend says %s", class, what)
}

// ProviderID is the ID Create gives the instance called name.
func ProviderID(name string) string { return "fake/" + name }

// SetStartState sets the state new instances start in (Provisioning, to
// test the polling of an instance that is not up yet).
func (f *Provider) SetStartState(s providers.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.startState = s
}

// SetDeleteGets sets how many Gets still see a deleted instance, Terminated,
// before it is NotFound (a huge number: it never finishes going away).
func (f *Provider) SetDeleteGets(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleteGets = n
}

// OnCreate makes fn run at the start of every Create, outside the fake's
// lock, so that it may block (to hold Creates in flight) or read the
// cluster the caller is in.
func (f *Provider) OnCreate(fn func(providers.CreateRequest)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onCreate = fn
}

// AnswerFailedCreate makes a Create that fails with an injected error return
// fn's instance beside the error, for a decorator's test that results pass
// through unchanged; without it a failed Create returns no instance.
func (f *Provider) AnswerFailedCreate(fn func(req providers.CreateRequest, err error) providers.Instance) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer = fn
}

// FailNext makes the next n calls of op fail with err.
func (f *Provider) FailNext(op string, n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range n {
		f.failures[op] = append(f.failures[op], err)
	}
}

// FailAlways makes every call of op fail with err until ClearFailures.
func (f *Provider) FailAlways(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sticky[op] = err
}

// FailDeleteOf makes every Delete of providerID fail with err, as a backend
// refuses to delete one instance (a permission, a lock) and not the others.
func (f *Provider) FailDeleteOf(providerID string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.byID[providerID] = err
}

// ClearFailures drops every failure FailNext, FailAlways and FailDeleteOf
// set up.
func (f *Provider) ClearFailures() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = map[string][]error{}
	f.sticky = map[string]error{}
	f.byID = map[string]error{}
}

// injected returns the error op must fail with now, if any; f.mu is held.
func (f *Provider) injected(op string) error {
	if q := f.failures[op]; len(q) > 0 {
		f.failures[op] = q[1:]
		return q[0]
	}
	return f.sticky[op]
}

// record appends a call; f.mu is held.
func (f *Provider) record(c Call) {
	c.At = time.Now()
	f.calls = append(f.calls, c)
}

// Count returns how many calls of op were made, failed ones included.
func (f *Provider) Count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c.Op == op {
			n++
		}
	}
	return n
}

// Calls returns a copy of every recorded call, in order.
func (f *Provider) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Creates returns the recorded Create requests.
func (f *Provider) Creates() []providers.CreateRequest {
	var out []providers.CreateRequest
	for _, c := range f.Calls() {
		if c.Op == providers.OpCreate {
			out = append(out, c.Req)
		}
	}
	return out
}

// Ops returns the sequence of operations, for ordering assertions.
func (f *Provider) Ops() []string {
	calls := f.Calls()
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.Op
	}
	return out
}

// Deleted returns the providerIDs of the Deletes that succeeded, in order.
func (f *Provider) Deleted() []string {
	var out []string
	for _, c := range f.Calls() {
		if c.Op == providers.OpDelete && c.Err == nil {
			out = append(out, c.Arg)
		}
	}
	return out
}

// SetState changes an instance's state as the backend would on its own.
func (f *Provider) SetState(providerID string, s providers.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if inst, ok := f.instances[providerID]; ok {
		inst.State = s
		if s == providers.StateRunning && inst.IP == "" {
			inst.IP = f.allocIP()
		}
	}
}

// State returns an instance's state, and whether the backend has it.
func (f *Provider) State(providerID string) (providers.State, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	inst, ok := f.instances[providerID]
	if !ok {
		return "", false
	}
	return inst.State, true
}

// Vanish removes an instance without a Delete, as when a VM is deleted by hand.
func (f *Provider) Vanish(providerID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.remove(providerID)
}

// remove forgets an instance; f.mu is held.
func (f *Provider) remove(providerID string) {
	delete(f.instances, providerID)
	delete(f.deleting, providerID)
	f.order = slices.DeleteFunc(f.order, func(id string) bool { return id == providerID })
}

// Put adds instances as they are, for tests of adoption and of the orphan
// GC: instances the provider did not create, with any owner and age.
func (f *Provider) Put(insts ...providers.Instance) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, inst := range insts {
		f.add(&inst)
	}
}

// add stores an instance; f.mu is held.
func (f *Provider) add(inst *providers.Instance) {
	if _, ok := f.instances[inst.ProviderID]; !ok {
		f.order = append(f.order, inst.ProviderID)
	}
	f.instances[inst.ProviderID] = inst
}

// Exists reports whether the backend has the instance (going away or not).
func (f *Provider) Exists(providerID string) bool {
	_, ok := f.State(providerID)
	return ok
}

// allocIP hands out loopback addresses: they are only data here, never
// dialled; f.mu is held.
func (f *Provider) allocIP() string {
	f.nextIP++
	return fmt.Sprintf("127.0.10.%d", f.nextIP)
}

// ProviderIDFor derives the ID Create would give, as the real providers do.
func (f *Provider) ProviderIDFor(req providers.CreateRequest) (string, error) {
	return ProviderID(req.Name), nil
}

// Create creates the instance req names, or returns the one it already
// has for the same owner.
func (f *Provider) Create(_ context.Context, req providers.CreateRequest) (providers.Instance, error) {
	f.mu.Lock()
	hook := f.onCreate
	f.mu.Unlock()
	if hook != nil {
		hook(req)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	inst, err := f.create(req)
	f.record(Call{Op: providers.OpCreate, Arg: req.Name, Req: req, Err: err})
	return inst, err
}

// create is Create's answer; f.mu is held.
func (f *Provider) create(req providers.CreateRequest) (providers.Instance, error) {
	if err := f.injected(providers.OpCreate); err != nil {
		if f.answer != nil {
			return f.answer(req, err), err
		}
		return providers.Instance{}, err
	}
	id := ProviderID(req.Name)
	if inst, ok := f.instances[id]; ok {
		if _, going := f.deleting[id]; going {
			return providers.Instance{}, ErrClass(providers.ErrTransient, "an instance named "+req.Name+" is still being deleted")
		}
		if inst.OwnerUID != req.OwnerUID {
			return providers.Instance{}, ErrClass(providers.ErrPermanent, "name taken by another owner")
		}
		return *inst, nil
	}
	inst := &providers.Instance{
		ProviderID: id, Name: req.Name, State: f.startState,
		OwnerUID: req.OwnerUID, Installation: req.Installation, CreatedAt: time.Now(),
	}
	if inst.State == providers.StateRunning {
		inst.IP = f.allocIP()
	}
	f.add(inst)
	return *inst, nil
}

// Get returns the instance; one going away is Terminated for the Gets
// SetDeleteGets allows, then NotFound.
func (f *Provider) Get(_ context.Context, providerID string) (providers.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	inst, err := f.get(providerID)
	f.record(Call{Op: providers.OpGet, Arg: providerID, Err: err})
	return inst, err
}

// get is Get's answer; f.mu is held.
func (f *Provider) get(providerID string) (providers.Instance, error) {
	if err := f.injected(providers.OpGet); err != nil {
		return providers.Instance{}, err
	}
	inst, ok := f.instances[providerID]
	if !ok {
		return providers.Instance{}, ErrClass(providers.ErrNotFound, providerID+" does not exist")
	}
	if left, going := f.deleting[providerID]; going {
		if left <= 0 {
			f.remove(providerID)
			return providers.Instance{}, ErrClass(providers.ErrNotFound, providerID+" does not exist")
		}
		f.deleting[providerID] = left - 1
	}
	return *inst, nil
}

// Delete starts the instance going away; a gone instance is no error.
func (f *Provider) Delete(_ context.Context, providerID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.delete(providerID)
	f.record(Call{Op: providers.OpDelete, Arg: providerID, Err: err})
	return err
}

// delete is Delete's answer; f.mu is held.
func (f *Provider) delete(providerID string) error {
	if err := f.injected(providers.OpDelete); err != nil {
		return err
	}
	if err := f.byID[providerID]; err != nil {
		return err
	}
	inst, ok := f.instances[providerID]
	if !ok {
		return nil
	}
	if _, going := f.deleting[providerID]; !going {
		f.deleting[providerID] = f.deleteGets
	}
	inst.State = providers.StateTerminated
	inst.IP = ""
	return nil
}

// ListByTag returns every instance the backend has, going away or not, in
// the order they appeared.
func (f *Provider) ListByTag(context.Context) ([]providers.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.injected(providers.OpList)
	f.record(Call{Op: providers.OpList, Err: err})
	if err != nil {
		return nil, err
	}
	out := make([]providers.Instance, 0, len(f.order))
	for _, id := range f.order {
		out = append(out, *f.instances[id])
	}
	return out, nil
}

// String summarises the calls, for failure messages.
func (f *Provider) String() string {
	var b strings.Builder
	for _, c := range f.Calls() {
		fmt.Fprintf(&b, "%s(%s) ", c.Op, c.Arg)
	}
	return b.String()
}
