// Package credentials resolves the full proxy URL of a Proxy - scheme, host,
// port and the login the upstream demands - for the three readers that need
// it: the Proxy reconciler, the health engine (probes must log in, or an
// authenticating Squid answers 407) and the lease API (gateways must send the
// login upstream).
//
// Logins live in Secrets labelled proxyfleet.io/credentials: "true". The
// controller reads them from a cache of its own that holds only such Secrets
// (NewCache), next to the manager's cache that holds only cloud-init
// Secrets: the controller may be allowed to read every Secret, but keeps in
// memory only the ones it uses, and reading them costs no API call per probe.
// Nothing here logs a password, and errors never carry one.
//
// It imports api/v1alpha1 and providers only; never the reconcilers, pool or
// gateway.
package credentials

import (
	"context"
	"fmt"
	"net/url"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/providers"
)

// CacheOptions configure NewCache.
type CacheOptions struct {
	// Scheme and Mapper are the manager's (mgr.GetScheme(), mgr.GetRESTMapper()).
	Scheme *runtime.Scheme
	Mapper meta.RESTMapper
	// Namespace restricts the cache to one namespace; empty is all of them.
	Namespace string
}

// NewCache returns a cache that holds only Secrets labelled
// proxyfleet.io/credentials: "true". It is a manager Runnable: add it to the
// manager (NewManager in package controller does) and it starts and syncs
// with the manager's own cache.
func NewCache(cfg *rest.Config, o CacheOptions) (cache.Cache, error) {
	co := cache.Options{
		Scheme: o.Scheme,
		Mapper: o.Mapper,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.LabelCredentials: v1alpha1.ValueTrue})},
		},
	}
	if o.Namespace != "" {
		co.DefaultNamespaces = map[string]cache.Config{o.Namespace: {}}
	}
	c, err := cache.New(cfg, co)
	if err != nil {
		return nil, fmt.Errorf("creating the credentials Secret cache: %w", err)
	}
	return c, nil
}

// GeneratedSecretName is the name of the Secret holding a Managed Proxy's
// generated login: derived from the UID like the instance name, so it is
// short, valid and found again after a controller restart.
func GeneratedSecretName(p *v1alpha1.Proxy) string {
	return providers.NameFromUID(string(p.UID)) + "-credentials"
}

// ProxyURL returns the URL the Proxy is reached at, login included when it
// has one: scheme://[user:password@]host:port. An External Proxy has
// spec.endpoint.scheme (http by default) and the login of
// spec.endpoint.credentialsSecretRef; a Managed Proxy is http, with its
// generated Secret's login when one exists and is controlled by the Proxy.
// It returns nil while the Proxy has no address. secrets must hold the
// credentials Secrets (the cache NewCache builds); a Secret missing from it
// is not a login. The error names the field and the Secret, never a
// password.
func ProxyURL(ctx context.Context, secrets client.Reader, p *v1alpha1.Proxy) (*url.URL, error) {
	addr := p.Address()
	if addr == "" {
		return nil, nil
	}
	u := &url.URL{Scheme: p.EffectiveScheme(), Host: addr}
	login, err := Login(ctx, secrets, p)
	if err != nil {
		return nil, err
	}
	if login != nil {
		u.User = url.UserPassword(login.Username, login.Password)
	}
	return u, nil
}

// Login returns the login a Proxy's upstream demands, nil when it demands
// none. For an External Proxy that is the Secret spec.endpoint.
// credentialsSecretRef names, which must exist with the label and both
// keys (the error says which is wrong, naming the field). For a Managed
// Proxy it is its generated Secret, when one exists and is controlled by
// the Proxy (a foreign Secret of that name is never used: the reconciler
// reports it).
func Login(ctx context.Context, secrets client.Reader, p *v1alpha1.Proxy) (*providers.BasicAuth, error) {
	if p.IsExternal() {
		return externalLogin(ctx, secrets, p)
	}
	key := types.NamespacedName{Namespace: p.Namespace, Name: GeneratedSecretName(p)}
	var s corev1.Secret
	if err := secrets.Get(ctx, key, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading credentials Secret %s: %w", key, err)
	}
	if !metav1.IsControlledBy(&s, p) {
		return nil, nil
	}
	return FromSecret(&s)
}

// externalLogin reads the Secret an External Proxy names, if any.
func externalLogin(ctx context.Context, secrets client.Reader, p *v1alpha1.Proxy) (*providers.BasicAuth, error) {
	name := p.CredentialsSecretName()
	if name == "" {
		return nil, nil
	}
	key := types.NamespacedName{Namespace: p.Namespace, Name: name}
	var s corev1.Secret
	if err := secrets.Get(ctx, key, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("spec.endpoint.credentialsSecretRef: Secret %s not found, or not labelled %s=%q (only labelled Secrets are read)",
				key, v1alpha1.LabelCredentials, v1alpha1.ValueTrue)
		}
		return nil, fmt.Errorf("spec.endpoint.credentialsSecretRef: reading Secret %s: %w", key, err)
	}
	login, err := FromSecret(&s)
	if err != nil {
		return nil, fmt.Errorf("spec.endpoint.credentialsSecretRef: %w", err)
	}
	return login, nil
}

// FromSecret reads the username and password keys of a credentials Secret,
// failing with the keys named when either is empty.
func FromSecret(s *corev1.Secret) (*providers.BasicAuth, error) {
	user, pass := string(s.Data[v1alpha1.CredentialsUsernameKey]), string(s.Data[v1alpha1.CredentialsPasswordKey])
	if user == "" || pass == "" {
		return nil, fmt.Errorf("credentials Secret %s/%s needs non-empty keys %q and %q",
			s.Namespace, s.Name, v1alpha1.CredentialsUsernameKey, v1alpha1.CredentialsPasswordKey)
	}
	return &providers.BasicAuth{Username: user, Password: pass}, nil
}
