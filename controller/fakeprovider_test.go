package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/providers"
)

// fakeProvider is the provider test double: an in-memory backend that records
// every call and can be told to fail any operation with any error class. It
// behaves like the contract says a real provider does (Create idempotent by
// name, Delete tolerant of gone instances, a deleted instance visible as
// Terminated for a few Gets before it is NotFound, Create refusing a name
// whose previous instance is still going away), so the reconciler under test
// meets the same sequences it meets in production.
type fakeProvider struct {
	mu        sync.Mutex
	instances map[string]*providers.Instance // by providerID
	// deleting counts the Gets left before a deleted instance disappears.
	deleting map[string]int
	calls    []fakeCall
	failures map[string][]error // op → errors to return, front first
	sticky   map[string]error   // op → error returned until cleared
	// startState is the state a new instance starts in.
	startState providers.State
	// deleteGets is how many Gets see a deleted instance before NotFound.
	deleteGets int
	nextIP     int
	// onCreate, when set, runs at the start of every Create.
	onCreate func(providers.CreateRequest)
}

// fakeCall is one recorded provider call.
type fakeCall struct {
	Op  string
	Arg string // instance name for create, providerID otherwise
	Req providers.CreateRequest
	At  time.Time
}

func newFakeProvider() *fakeProvider {
	return &fakeProvider{
		instances:  map[string]*providers.Instance{},
		deleting:   map[string]int{},
		failures:   map[string][]error{},
		sticky:     map[string]error{},
		startState: providers.StateRunning,
		deleteGets: 2,
	}
}

// errClass builds an error of the given class, as a provider would wrap it.
func errClass(class error, what string) error {
	return fmt.Errorf("%w: fake backend says %s", class, what)
}

// failNext makes the next n calls of op fail with err.
func (f *fakeProvider) failNext(op string, n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range n {
		f.failures[op] = append(f.failures[op], err)
	}
}

// failAlways makes every call of op fail with err until clearFailures.
func (f *fakeProvider) failAlways(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sticky[op] = err
}

func (f *fakeProvider) clearFailures() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = map[string][]error{}
	f.sticky = map[string]error{}
}

// injected returns the error op must fail with now, if any; f.mu is held.
func (f *fakeProvider) injected(op string) error {
	if q := f.failures[op]; len(q) > 0 {
		f.failures[op] = q[1:]
		return q[0]
	}
	return f.sticky[op]
}

func (f *fakeProvider) record(c fakeCall) {
	c.At = time.Now()
	f.calls = append(f.calls, c)
}

// count returns how many calls of op were made.
func (f *fakeProvider) count(op string) int {
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

// creates returns the recorded Create requests.
func (f *fakeProvider) creates() []providers.CreateRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []providers.CreateRequest
	for _, c := range f.calls {
		if c.Op == providers.OpCreate {
			out = append(out, c.Req)
		}
	}
	return out
}

// ops returns the sequence of operations, for ordering assertions.
func (f *fakeProvider) ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.calls))
	for i, c := range f.calls {
		out[i] = c.Op
	}
	return out
}

// setState changes an instance's state as the backend would on its own.
func (f *fakeProvider) setState(providerID string, s providers.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if inst, ok := f.instances[providerID]; ok {
		inst.State = s
		if s == providers.StateRunning && inst.IP == "" {
			inst.IP = f.allocIP()
		}
	}
}

// vanish removes an instance without a Delete, as when a VM is deleted by hand.
func (f *fakeProvider) vanish(providerID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.instances, providerID)
	delete(f.deleting, providerID)
}

// put adds an instance directly, for adoption tests.
func (f *fakeProvider) put(inst providers.Instance) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instances[inst.ProviderID] = &inst
}

func (f *fakeProvider) exists(providerID string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.instances[providerID]
	return ok
}

// allocIP hands out loopback addresses: they are only data here, never dialled.
func (f *fakeProvider) allocIP() string {
	f.nextIP++
	return fmt.Sprintf("127.0.10.%d", f.nextIP)
}

func fakeProviderID(name string) string { return "fake/" + name }

// ProviderIDFor derives the ID Create would give, as the real providers do.
func (f *fakeProvider) ProviderIDFor(req providers.CreateRequest) (string, error) {
	return fakeProviderID(req.Name), nil
}

func (f *fakeProvider) Create(_ context.Context, req providers.CreateRequest) (providers.Instance, error) {
	f.mu.Lock()
	hook := f.onCreate
	f.mu.Unlock()
	if hook != nil {
		hook(req)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(fakeCall{Op: providers.OpCreate, Arg: req.Name, Req: req})
	if err := f.injected(providers.OpCreate); err != nil {
		return providers.Instance{}, err
	}
	id := fakeProviderID(req.Name)
	if inst, ok := f.instances[id]; ok {
		if _, going := f.deleting[id]; going {
			return providers.Instance{}, errClass(providers.ErrTransient, "an instance named "+req.Name+" is still being deleted")
		}
		if inst.OwnerUID != req.OwnerUID {
			return providers.Instance{}, errClass(providers.ErrPermanent, "name taken by another owner")
		}
		return *inst, nil
	}
	inst := &providers.Instance{
		ProviderID: id, Name: req.Name, State: f.startState,
		OwnerUID: req.OwnerUID, CreatedAt: time.Now(),
	}
	if inst.State == providers.StateRunning {
		inst.IP = f.allocIP()
	}
	f.instances[id] = inst
	return *inst, nil
}

func (f *fakeProvider) Get(_ context.Context, providerID string) (providers.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(fakeCall{Op: providers.OpGet, Arg: providerID})
	if err := f.injected(providers.OpGet); err != nil {
		return providers.Instance{}, err
	}
	inst, ok := f.instances[providerID]
	if !ok {
		return providers.Instance{}, errClass(providers.ErrNotFound, providerID+" does not exist")
	}
	if left, going := f.deleting[providerID]; going {
		if left <= 0 {
			delete(f.instances, providerID)
			delete(f.deleting, providerID)
			return providers.Instance{}, errClass(providers.ErrNotFound, providerID+" does not exist")
		}
		f.deleting[providerID] = left - 1
	}
	return *inst, nil
}

func (f *fakeProvider) Delete(_ context.Context, providerID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(fakeCall{Op: providers.OpDelete, Arg: providerID})
	if err := f.injected(providers.OpDelete); err != nil {
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

func (f *fakeProvider) ListByTag(context.Context) ([]providers.Instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(fakeCall{Op: providers.OpList})
	if err := f.injected(providers.OpList); err != nil {
		return nil, err
	}
	out := make([]providers.Instance, 0, len(f.instances))
	for _, inst := range f.instances {
		out = append(out, *inst)
	}
	return out, nil
}

// String summarises the calls, for failure messages.
func (f *fakeProvider) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, c := range f.calls {
		fmt.Fprintf(&b, "%s(%s) ", c.Op, c.Arg)
	}
	return b.String()
}
