package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/proxyfleet/proxyfleet/providers"
)

func TestParseProviderID(t *testing.T) {
	tests := []struct {
		id   string
		want types.NamespacedName
		ok   bool
	}{
		{"kubernetes://egress/proxy-abc", types.NamespacedName{Namespace: "egress", Name: "proxy-abc"}, true},
		{"kubernetes://egress/proxy.abc", types.NamespacedName{Namespace: "egress", Name: "proxy.abc"}, true},
		{"kubernetes://egress", types.NamespacedName{}, false},
		{"kubernetes://egress/", types.NamespacedName{}, false},
		{"kubernetes:///proxy-abc", types.NamespacedName{}, false},
		{"kubernetes://egress/proxy-abc/extra", types.NamespacedName{}, false},
		{"kubernetes://Egress/proxy-abc", types.NamespacedName{}, false},
		{"kubernetes://egress/Proxy", types.NamespacedName{}, false},
		{"gcp://egress/proxy-abc", types.NamespacedName{}, false},
		{"egress/proxy-abc", types.NamespacedName{}, false},
		{"zones/europe-west1-b/instances/proxy-abc", types.NamespacedName{}, false},
		{"", types.NamespacedName{}, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q", tt.id), func(t *testing.T) {
			got, err := parseProviderID(tt.id)
			if tt.ok {
				if err != nil || got != tt.want {
					t.Fatalf("parseProviderID = %v, %v; want %v", got, err, tt.want)
				}
				if formatProviderID(got.Namespace, got.Name) != tt.id {
					t.Fatalf("formatProviderID does not round-trip %q", tt.id)
				}
				return
			}
			if !errors.Is(err, providers.ErrPermanent) {
				t.Fatalf("parseProviderID(%q) = %v, %v; want ErrPermanent", tt.id, got, err)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"not found", apierrors.NewNotFound(pods, "p"), providers.ErrNotFound},
		{"RBAC denial is permanent", apierrors.NewForbidden(pods, "p", errors.New(`User "system:serviceaccount:x:y" cannot create resource "pods"`)), providers.ErrPermanent},
		{"exceeded ResourceQuota is quota", apierrors.NewForbidden(pods, "p", errors.New("exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1")), providers.ErrQuotaExceeded},
		{"quota not yet counted is transient", apierrors.NewForbidden(pods, "p", errors.New("status unknown for quota: q, resources: pods")), providers.ErrTransient},
		{"invalid is permanent", apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "p", field.ErrorList{field.Invalid(field.NewPath("spec"), "x", "bad")}), providers.ErrPermanent},
		{"bad request is permanent", apierrors.NewBadRequest("bad"), providers.ErrPermanent},
		{"unauthorized is transient", apierrors.NewUnauthorized("token expired"), providers.ErrTransient},
		{"conflict is transient", apierrors.NewConflict(pods, "p", errors.New("changed")), providers.ErrTransient},
		{"timeout is transient", apierrors.NewTimeoutError("slow", 1), providers.ErrTransient},
		{"server timeout is transient", apierrors.NewServerTimeout(pods, "create", 1), providers.ErrTransient},
		{"throttled is transient", apierrors.NewTooManyRequests("slow down", 1), providers.ErrTransient},
		{"internal error is transient", apierrors.NewInternalError(errors.New("etcd")), providers.ErrTransient},
		{"unavailable is transient", apierrors.NewServiceUnavailable("down"), providers.ErrTransient},
		{"context deadline is transient", fmt.Errorf("get: %w", context.DeadlineExceeded), providers.ErrTransient},
		{"connection refused is transient", errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"), providers.ErrTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := classify("creating pod egress/p", tt.err)
			if providers.Class(got) != tt.want {
				t.Fatalf("classify(%v) has class %v, want %v", tt.err, providers.Class(got), tt.want)
			}
			if !errors.Is(got, tt.err) || !strings.Contains(got.Error(), "creating pod egress/p") {
				t.Fatalf("classify lost the cause or the operation: %v", got)
			}
		})
	}
	if classify("x", nil) != nil {
		t.Fatal("classify(nil) is not nil")
	}
}
