package manager

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/proxyfleet/proxyfleet/internal/logging"
)

// restConfig loads the kubeconfig at path (named name in errors) when
// given, else the in-cluster config, else the usual $KUBECONFIG /
// ~/.kube/config rules.
func restConfig(path, name string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, path, err)
		}
		return cfg, nil
	}
	if cfg, err := rest.InClusterConfig(); err == nil {
		return cfg, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes config: not in a cluster, and %s / $KUBECONFIG / ~/.kube/config gave none: %w", name, err)
	}
	return cfg, nil
}

// limitAPIRequests sets the client-side rate limit of every client built
// from kube (the manager's, the caches', the kubernetes provider's).
func (cfg *Config) limitAPIRequests(kube *rest.Config) {
	kube.QPS, kube.Burst = float32(cfg.KubeAPIQPS), cfg.KubeAPIBurst
}

// apiServerHosts are the API server's address as this process reaches it
// and as pods do ($KUBERNETES_SERVICE_HOST), for NO_PROXY.
func apiServerHosts(cfg *rest.Config) []string {
	var out []string
	if cfg != nil {
		if u, err := url.Parse(cfg.Host); err == nil && u.Hostname() != "" {
			out = append(out, u.Hostname())
		}
	}
	if h := os.Getenv("KUBERNETES_SERVICE_HOST"); h != "" && net.ParseIP(h) != nil && (len(out) == 0 || out[0] != h) {
		out = append(out, h)
	}
	return out
}

// processLogger builds the process logger (logging.New) and makes it
// every logger of the process: the slog and standard-library default
// (controller-runtime's metrics and probe servers log their errors
// there), controller-runtime's and klog's (client-go's leader election
// and informers log through klog). It returns it as the logr.Logger
// controller-runtime hands to every reconcile. klog.SetLogger, unlike
// klog.SetSlogLogger with a level mapping, keeps klog's own verbosity
// gate: klog.V(n) lines above klog's -v (0 here) are dropped before they
// reach the logger.
func processLogger(w io.Writer, level slog.Level, json bool) logr.Logger {
	l := logging.New(w, level, json)
	logging.Install(l)
	logger := logging.Logr(l)
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	return logger
}
