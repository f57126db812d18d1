package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
)

// LeaderElectionID names the Lease the controller replicas compete for.
const LeaderElectionID = "proxyfleet-controller.proxyfleet.io"

// ManagerOptions configure the manager the reconcilers run on.
type ManagerOptions struct {
	// ProxyNamespace restricts the cache (Proxies and cloud-init Secrets) to
	// one namespace; empty watches all namespaces.
	ProxyNamespace string
	// MetricsAddr is the metrics listen address; "0" turns it off.
	MetricsAddr string
	// HealthProbeAddr serves /healthz and /readyz; "" or "0" turns it off.
	HealthProbeAddr string
	// LeaderElection makes replicas elect one active controller.
	LeaderElection bool
	// LeaderElectionNamespace holds the Lease; empty means the in-cluster
	// namespace, or ProxyNamespace when that is set.
	LeaderElectionNamespace string
	// Logger is the manager's logger, handed to every reconcile via ctx.
	Logger logr.Logger
}

// NewScheme returns a scheme with the core Kubernetes types and proxyfleet's.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Manager is the controller-runtime manager plus the second cache that
// holds the credentials Secrets. It is a ctrl.Manager; the reconciler, the
// health engine and the lease API find the credentials cache through
// Credentials when they are not given one.
type Manager struct {
	ctrl.Manager
	credentials cache.Cache
}

// Credentials is the cache of Secrets labelled proxyfleet.io/credentials:
// "true" (proxy logins), restricted like the manager's own cache.
func (m *Manager) Credentials() cache.Cache { return m.credentials }

// CredentialsCacheOf returns mgr's credentials cache when mgr is a *Manager
// (or wraps one the same way), nil otherwise.
func CredentialsCacheOf(mgr ctrl.Manager) cache.Cache {
	if m, ok := mgr.(interface{ Credentials() cache.Cache }); ok {
		return m.Credentials()
	}
	return nil
}

// NewManager builds the controller-runtime manager with proxyfleet's cache
// rules: the manager's cache holds Secrets only when labelled
// proxyfleet.io/cloud-init: "true", and a second cache, added to the manager
// as a runnable, holds only Secrets labelled proxyfleet.io/credentials:
// "true" (the controller may read every Secret, but holds only the ones it
// uses in memory; one cache cannot select on two labels). Everything is
// restricted to ProxyNamespace when it is set. Reconcilers and runnables are
// added by the caller.
func NewManager(cfg *rest.Config, o ManagerOptions) (*Manager, error) {
	scheme, err := NewScheme()
	if err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	cacheOpts := cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.LabelCloudInit: v1alpha1.ValueTrue})},
		},
	}
	if o.ProxyNamespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{o.ProxyNamespace: {}}
	}
	electionNS := o.LeaderElectionNamespace
	if electionNS == "" {
		electionNS = o.ProxyNamespace
	}
	metricsAddr := o.MetricsAddr
	if metricsAddr == "" {
		metricsAddr = "0"
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   cacheOpts,
		Logger:                  o.Logger,
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  o.HealthProbeAddr,
		LeaderElection:          o.LeaderElection,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: electionNS,
		// A replica that stops cleanly hands over at once instead of making
		// the next leader wait out the lease.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	creds, err := credentials.NewCache(cfg, credentials.CacheOptions{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), Namespace: o.ProxyNamespace,
	})
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(cacheRunnable{creds}); err != nil {
		return nil, fmt.Errorf("adding the credentials Secret cache: %w", err)
	}
	if o.HealthProbeAddr != "" && o.HealthProbeAddr != "0" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("cache", func(req *http.Request) error {
			if !mgr.GetCache().WaitForCacheSync(req.Context()) {
				return errors.New("cache not synced")
			}
			if !creds.WaitForCacheSync(req.Context()) {
				return errors.New("credentials Secret cache not synced")
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return &Manager{Manager: mgr, credentials: creds}, nil
}

// cacheRunnable puts a cache in the manager's cache group: started before
// any controller, and waited on until it syncs (a plain cache.Cache would
// land among the other runnables, started without waiting).
type cacheRunnable struct{ c cache.Cache }

// GetCache is what the manager recognises a cache runnable by.
func (r cacheRunnable) GetCache() cache.Cache { return r.c }

// Start runs the cache until ctx ends.
func (r cacheRunnable) Start(ctx context.Context) error { return r.c.Start(ctx) }
