package inject

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Options configure Setup.
type Options struct {
	// Listen is the webhook's host:port.
	Listen string
	// Config is the injection's settings.
	Config Config
	// CertDir, when set, serves certificates someone else manages
	// (cert-manager); CertSecret, Configuration and Hosts are then unused.
	CertDir string
	// CertSecret is the self-managed CA and serving certificate's Secret.
	CertSecret types.NamespacedName
	// Configuration is the MutatingWebhookConfiguration whose caBundle is kept.
	Configuration string
	// Hosts are the serving certificate's names and addresses.
	Hosts []string
	// CertInterval is how often the self-managed certificates are checked (default 1m).
	CertInterval time.Duration
	// Client writes the Secret and the caBundle; nil is the manager's client.
	// The Secret is read directly, not through the manager's cache, which
	// holds only labelled Secrets.
	Client client.Client
	// Log is the logger.
	Log logr.Logger
}

// Setup validates o, opens the listener and adds the webhook server and its
// certificate keeper to mgr.
func Setup(mgr manager.Manager, o Options) (*Server, error) {
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
	log := o.Log.WithName("inject")
	var certs interface {
		CertSource
		manager.Runnable
	}
	if o.CertDir != "" {
		d, err := NewDirCerts(o.CertDir)
		if err != nil {
			return nil, err
		}
		certs = d
	} else {
		if o.CertSecret.Name == "" || o.CertSecret.Namespace == "" {
			return nil, errors.New("--webhook-cert-secret: want NAMESPACE/NAME")
		}
		if o.Configuration == "" {
			return nil, errors.New("--webhook-configuration: empty")
		}
		if len(o.Hosts) == 0 {
			return nil, errors.New("--webhook-cert-hosts: empty")
		}
		c := o.Client
		if c == nil {
			var err error
			if c, err = client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()}); err != nil {
				return nil, fmt.Errorf("sidecar injection: client: %w", err)
			}
		}
		certs = &SelfManaged{Client: c, Secret: o.CertSecret, Configuration: o.Configuration, Hosts: o.Hosts,
			Interval: o.CertInterval, Log: log}
	}
	h := &Handler{Config: o.Config, Namespaces: mgr.GetAPIReader(), Log: log}
	srv, err := NewServer(o.Listen, h, mgr.GetScheme(), certs, log)
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(certs); err != nil {
		_ = srv.ln.Close()
		return nil, fmt.Errorf("sidecar injection: adding the certificates: %w", err)
	}
	if err := mgr.Add(srv); err != nil {
		_ = srv.ln.Close()
		return nil, fmt.Errorf("sidecar injection: adding the webhook server: %w", err)
	}
	return srv, nil
}
