package gc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// proxyReader is a client.Reader test double for the sweep's logic tests: it
// lists the given Proxies or fails with err.
type proxyReader struct {
	mu      sync.Mutex
	proxies []v1alpha1.Proxy
	err     error
	lists   int
}

func (r *proxyReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("proxyReader: Get is not used by the GC")
}

func (r *proxyReader) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lists++
	if r.err != nil {
		return r.err
	}
	pl, ok := list.(*v1alpha1.ProxyList)
	if !ok {
		return fmt.Errorf("proxyReader: cannot list %T", list)
	}
	pl.Items = append([]v1alpha1.Proxy(nil), r.proxies...)
	return nil
}

func (r *proxyReader) listCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lists
}

// newSweeper is New for options a test knows to be valid.
// testInstallation is the installation ID of the sweepers these tests
// start (unless a test sets its own) and of the instances they make.
const testInstallation = "test-installation"

func newSweeper(t *testing.T, o Options) *Sweeper {
	t.Helper()
	if o.Installation == "" {
		o.Installation = testInstallation
	}
	s, err := New(o)
	if err != nil {
		t.Fatalf("gc.New: %v", err)
	}
	return s
}
