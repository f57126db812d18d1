package e2e

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// proxyWatch records the Proxies of one namespace at a point in time and
// watches the API server for every write to them from that point on, so a
// write is seen even if a later one made the object look unchanged.
type proxyWatch struct {
	c     client.WithWatch
	ns    string
	start map[string]string // name -> resourceVersion when the watch began
	w     watch.Interface
}

// fleetWatchProxies lists the Proxies in ns and starts a watch at the list's
// resourceVersion, leaving no gap between the two.
func fleetWatchProxies(ctx context.Context, env *testenv.Env, ns string) (*proxyWatch, error) {
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, err
	}
	var list v1alpha1.ProxyList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	pw := &proxyWatch{c: c, ns: ns, start: map[string]string{}}
	for _, p := range list.Items {
		pw.start[p.Name] = p.ResourceVersion
	}
	pw.w, err = c.Watch(ctx, &v1alpha1.ProxyList{}, client.InNamespace(ns),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		return nil, err
	}
	return pw, nil
}

// collect returns every event the watch delivers until ctx ends, then stops
// the watch. A watch the server ends early is itself reported as an event,
// since the rest of the window went unobserved.
func (pw *proxyWatch) collect(ctx context.Context) []string {
	defer pw.w.Stop()
	var events []string
	for {
		select {
		case <-ctx.Done():
			return events
		case ev, ok := <-pw.w.ResultChan():
			if !ok {
				return append(events, "the watch ended early; the rest of the window is unobserved")
			}
			if p, isProxy := ev.Object.(*v1alpha1.Proxy); isProxy {
				events = append(events, fmt.Sprintf("%s %s (resourceVersion %s, phase %s)", ev.Type, p.Name, p.ResourceVersion, p.Status.Phase))
			} else {
				events = append(events, fmt.Sprintf("%s %T", ev.Type, ev.Object))
			}
		}
	}
}

// list returns the Proxies' current resourceVersions by name.
func (pw *proxyWatch) list(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	var list v1alpha1.ProxyList
	if err := pw.c.List(ctx, &list, client.InNamespace(pw.ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range list.Items {
		out[p.Name] = p.ResourceVersion
	}
	return out
}
