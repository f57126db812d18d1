//go:build !sidecar

package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyfleet/proxyfleet/controller/inject"
)

// Flags of the sidecar injection webhook.
const (
	flagWebhookListen        = "webhook-listen"
	flagWebhookConfiguration = "webhook-configuration"
	flagWebhookCertSecret    = "webhook-cert-secret"
	flagWebhookCertHosts     = "webhook-cert-hosts"
	flagWebhookCertDir       = "webhook-cert-dir"
	flagGatewayImage         = "gateway-image"
	flagSidecarLeaseAPI      = "sidecar-lease-api"
	flagSidecarResources     = "sidecar-resources"
	flagClusterDomain        = "cluster-domain"
	flagSidecarNoProxy       = "sidecar-no-proxy"
	flagWebhookService       = "webhook-service"
	flagLeaseAPIService      = "lease-api-service"
)

// Defaults of the injection flags: the chart's Service names, and the
// sidecar's resources from its measured figures (docs/performance.md): a
// request above its idle RSS (15.3 MiB), a limit about twice what it holds
// with 1000 idle tunnels (25.3 MiB), so GOMEMLIMIT (90%) is 43 MiB.
const (
	defaultWebhookService   = "proxyfleet-webhook"
	defaultLeaseAPIService  = "proxyfleet"
	defaultSidecarResources = "requests.cpu=10m,requests.memory=8Mi,limits.memory=40Mi"
)

// serviceAccountNamespaceFile is where a pod finds its namespace.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// webhookFlags are the injection webhook's flags; controllerCommand appends them.
func webhookFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag(flagWebhookListen, ":9443", "`ADDR` serving the sidecar injection webhook (HTTPS) when --gateway-image is set; 0 turns it off"),
		stringFlag(flagGatewayImage, "", "`IMAGE` of the injected gateway sidecar (its entrypoint; /proxyfleet-mitm for proxyfleet.io/mitm pods); without it sidecar injection is off"),
		stringFlag(flagWebhookConfiguration, "proxyfleet-inject", "`NAME` of the MutatingWebhookConfiguration whose caBundle the controller keeps current"),
		stringFlag(flagWebhookCertSecret, "", "`NAMESPACE/NAME` of the Secret holding the webhook's CA and serving certificate (default: <controller namespace>/proxyfleet-webhook-cert)"),
		stringFlag(flagWebhookCertHosts, "", "comma-separated DNS names and IPs of the serving certificate (default: the --webhook-service's names)"),
		pathFlag(flagWebhookCertDir, "`DIR` with tls.crt and tls.key kept by someone else (cert-manager); the controller then manages neither certificate nor caBundle"),
		stringFlag(flagWebhookService, defaultWebhookService, "`NAME` of the webhook's Service, for the default --webhook-cert-hosts"),
		stringFlag(flagLeaseAPIService, defaultLeaseAPIService, "`NAME` of the lease API's Service, for the default --sidecar-lease-api"),
		stringFlag(flagSidecarLeaseAPI, "", "`URL` injected gateways lease from (default: http://<--lease-api-service>.<controller namespace>.svc:8090)"),
		stringFlag(flagSidecarResources, defaultSidecarResources, "the sidecar's `RESOURCES` (requests.cpu=,requests.memory=,limits.cpu=,limits.memory=); the proxyfleet.io/gateway-resources annotation overrides them"),
		stringFlag(flagClusterDomain, "cluster.local", "the cluster's DNS `DOMAIN`, kept out of the sidecar's proxy (NO_PROXY)"),
		listFlag(flagSidecarNoProxy, "`HOSTS` (comma-separated or repeated: hosts, .domains, IPs, CIDRs) every injected pod reaches directly, added to its NO_PROXY: the cluster's service and pod CIDRs, so ClusterIPs and pod IPs do not go to the sidecar (which refuses private targets)"),
	}
}

// controllerNamespace is the pod's namespace: $POD_NAMESPACE (the chart
// sets it from the downward API), else the service-account file, else "".
func controllerNamespace() string {
	if ns := strings.TrimSpace(os.Getenv("POD_NAMESPACE")); ns != "" {
		return ns
	}
	if b, err := os.ReadFile(serviceAccountNamespaceFile); err == nil {
		return strings.TrimSpace(string(b))
	}
	return ""
}

// readWebhook reads the injection flags, naming the wrong one.
func (cfg *controllerConfig) readWebhook(c *cli.Context) (err error) {
	cfg.Webhook, err = webhookFrom(c)
	return err
}

// webhookFrom reads the injection flags; its Listen is "" when injection
// is off. The run adds the API server's addresses once it has the cluster
// config.
func webhookFrom(c *cli.Context) (inject.Options, error) {
	var s inject.Options
	listen := strings.TrimSpace(c.String(flagWebhookListen))
	image := strings.TrimSpace(c.String(flagGatewayImage))
	if listen == "" || listen == "0" || listen == "off" || image == "" {
		return s, nil
	}
	if _, err := checkListenAddr(flagWebhookListen, listen); err != nil {
		return s, err
	}
	ns := controllerNamespace()
	needNS := func(flag string) error {
		return fmt.Errorf("--%s: no default outside a cluster (set $POD_NAMESPACE or give the flag)", flag)
	}
	res, err := inject.ParseResources(c.String(flagSidecarResources), corev1.ResourceRequirements{})
	if err != nil {
		return s, fmt.Errorf("--%s: %w", flagSidecarResources, err)
	}
	targets, err := clusterTargetsFrom(c)
	if err != nil {
		return s, err
	}
	poolAPI := strings.TrimSpace(c.String(flagSidecarLeaseAPI))
	if poolAPI == "" {
		if ns == "" {
			return s, needNS(flagSidecarLeaseAPI)
		}
		poolAPI = fmt.Sprintf("http://%s.%s.svc:8090", c.String(flagLeaseAPIService), ns)
	}
	o := inject.Options{
		Listen:        listen,
		CertDir:       c.Path(flagWebhookCertDir),
		Configuration: strings.TrimSpace(c.String(flagWebhookConfiguration)),
		Config: inject.Config{
			Image:          image,
			PoolAPI:        poolAPI,
			Resources:      res,
			ClusterDomain:  strings.Trim(c.String(flagClusterDomain), ". "),
			ClusterNoProxy: splitList(c.StringSlice(flagSidecarNoProxy)),
			ClusterTargets: targets,
		},
	}
	if ns != "" {
		o.Config.SkipNamespaces = []string{ns}
	}
	if err := o.Config.Validate(); err != nil {
		return s, err
	}
	if o.CertDir == "" {
		switch sec := strings.TrimSpace(c.String(flagWebhookCertSecret)); {
		case sec == "" && ns == "":
			return s, needNS(flagWebhookCertSecret)
		case sec == "":
			o.CertSecret = types.NamespacedName{Namespace: ns, Name: "proxyfleet-webhook-cert"}
		default:
			n, name, ok := strings.Cut(sec, "/")
			if !ok || n == "" || name == "" || strings.Contains(name, "/") {
				return s, fmt.Errorf("--%s %q: want NAMESPACE/NAME", flagWebhookCertSecret, sec)
			}
			o.CertSecret = types.NamespacedName{Namespace: n, Name: name}
		}
		if o.Configuration == "" {
			return s, fmt.Errorf("--%s: empty", flagWebhookConfiguration)
		}
		for _, h := range strings.Split(c.String(flagWebhookCertHosts), ",") {
			if h = strings.TrimSpace(h); h != "" {
				o.Hosts = append(o.Hosts, h)
			}
		}
		if len(o.Hosts) == 0 {
			if ns == "" {
				return s, needNS(flagWebhookCertHosts)
			}
			svc := c.String(flagWebhookService)
			o.Hosts = []string{svc + "." + ns + ".svc", svc + "." + ns + ".svc." + o.Config.ClusterDomain}
		}
	}
	return o, nil
}

// splitList is a list flag's values as entries: comma-separated within one
// value too (a config file's or the environment's one string), blanks
// dropped.
func splitList(values []string) []string {
	var out []string
	for _, v := range values {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
	}
	return out
}
