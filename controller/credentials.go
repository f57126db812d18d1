package controller

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
	"github.com/proxyfleet/proxyfleet/providers"
)

// ProxyUsername is the user name of every generated proxy login; the
// password is what is secret.
const ProxyUsername = "proxyfleet"

// ensureCredentials returns the Proxy's generated login, creating its Secret
// on first use: 32 random bytes, owned by the Proxy (so the garbage collector
// removes it with the Proxy even when the finalizer is skipped) and labelled
// as proxyfleet's credentials, which puts it in the credentials cache the
// health engine and the lease API read it from. A cache miss is confirmed
// with the API server before creating, so a Secret created a moment ago and
// not cached yet is not created twice. The password is never logged, and
// never placed in a condition.
func (r *ProxyReconciler) ensureCredentials(ctx context.Context, p *v1alpha1.Proxy) (*providers.BasicAuth, error) {
	key := types.NamespacedName{Namespace: p.Namespace, Name: credentials.GeneratedSecretName(p)}
	var s corev1.Secret
	err := r.Credentials.Get(ctx, key, &s)
	if apierrors.IsNotFound(err) {
		err = r.apiReader.Get(ctx, key, &s)
	}
	switch {
	case err == nil:
		if !metav1.IsControlledBy(&s, p) {
			return nil, fmt.Errorf("credentials Secret %s exists but is not owned by this Proxy; refusing to use it", key)
		}
		if s.Labels[v1alpha1.LabelCredentials] != v1alpha1.ValueTrue {
			return nil, fmt.Errorf("credentials Secret %s lost its label %s=%q; put it back, or delete the Secret to have a new login generated (the instance is then replaced)",
				key, v1alpha1.LabelCredentials, v1alpha1.ValueTrue)
		}
		login, err := credentials.FromSecret(&s)
		if err != nil {
			return nil, fmt.Errorf("%w; delete it to have a new login generated (the instance is then replaced)", err)
		}
		return login, nil
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("reading credentials Secret %s: %w", key, err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("generating a proxy password: %w", err)
	}
	pass := base64.RawURLEncoding.EncodeToString(raw)
	s = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: key.Namespace, Name: key.Name,
			Labels: map[string]string{
				v1alpha1.LabelManagedBy:   v1alpha1.ManagedByValue,
				v1alpha1.LabelCredentials: v1alpha1.ValueTrue,
				v1alpha1.LabelUID:         string(p.UID),
			},
		},
		Type: corev1.SecretTypeBasicAuth,
		Data: map[string][]byte{
			v1alpha1.CredentialsUsernameKey: []byte(ProxyUsername),
			v1alpha1.CredentialsPasswordKey: []byte(pass),
		},
	}
	if err := controllerutil.SetControllerReference(p, &s, r.Client.Scheme()); err != nil {
		return nil, err
	}
	if err := r.Client.Create(ctx, &s); err != nil {
		return nil, fmt.Errorf("creating credentials Secret %s: %w", key, err)
	}
	loggerFor(ctx, p).Info("generated the proxy login", "secret", key.Name)
	return &providers.BasicAuth{Username: ProxyUsername, Password: pass}, nil
}

// deleteCredentials removes the generated login once the instance is gone.
// Owner references would do it too, but only where a garbage collector runs.
func (r *ProxyReconciler) deleteCredentials(ctx context.Context, p *v1alpha1.Proxy) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: credentials.GeneratedSecretName(p)}}
	err := r.Client.Delete(ctx, s)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting credentials Secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	return nil
}

// credentialsFingerprint goes into the spec hash, so a login regenerated
// after its Secret was deleted replaces the instance that knows the old one.
func credentialsFingerprint(a *providers.BasicAuth) string {
	if a == nil {
		return ""
	}
	sum := sha256.Sum256([]byte("proxyfleet-login\x00" + a.Username + "\x00" + a.Password))
	return hex.EncodeToString(sum[:8])
}
