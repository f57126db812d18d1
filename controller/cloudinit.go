package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

// secretRefName is the name of the referenced cloud-init Secret, or "".
func secretRefName(p *v1alpha1.Proxy) string {
	if p.Spec.CloudInit == nil || p.Spec.CloudInit.SecretRef == nil {
		return ""
	}
	return p.Spec.CloudInit.SecretRef.Name
}

// resolveCloudInit returns the Proxy's cloud-init user-data: the inline block,
// or the key of a Secret in the Proxy's namespace. The Secret is read from the
// manager cache, which holds only Secrets labelled proxyfleet.io/cloud-init:
// "true", so an unlabelled Secret is reported as missing, by construction.
func (r *ProxyReconciler) resolveCloudInit(ctx context.Context, p *v1alpha1.Proxy) ([]byte, error) {
	ci := p.Spec.CloudInit
	if ci == nil {
		return nil, nil
	}
	if ci.SecretRef == nil {
		return []byte(ci.Inline), nil
	}
	key := ci.SecretRef.SecretKey()
	var s corev1.Secret
	name := types.NamespacedName{Namespace: p.Namespace, Name: ci.SecretRef.Name}
	if err := r.Client.Get(ctx, name, &s); err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("cloud-init Secret %s not found, or not labelled %s=%q (only labelled Secrets are readable)",
				name, v1alpha1.LabelCloudInit, v1alpha1.ValueTrue)
		}
		return nil, fmt.Errorf("reading cloud-init Secret %s: %w", name, err)
	}
	data, ok := s.Data[key]
	if !ok {
		return nil, fmt.Errorf("cloud-init Secret %s has no key %q", name, key)
	}
	return data, nil
}
