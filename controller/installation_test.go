package controller

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestInstallationIDIsTheClusterKubeSystemUID(t *testing.T) {
	t.Parallel()
	var ns corev1.Namespace
	if err := env.Client.Get(context.Background(), types.NamespacedName{Name: InstallationNamespace}, &ns); err != nil {
		t.Fatal(err)
	}
	id, err := InstallationID(context.Background(), env.Client)
	if err != nil || id != string(ns.UID) || id == "" {
		t.Fatalf("InstallationID = %q, %v; want kube-system's UID %q", id, err, ns.UID)
	}
}

func TestCheckInstallationIDAcceptsOnlyWhatEveryBackendCarries(t *testing.T) {
	for id, ok := range map[string]bool{
		"0e5c6c1e-0000-4000-8000-00000000dead": true,
		"prod-eu":                              true,
		"a":                                    true,
		"":                                     false,
		"Prod":                                 false, // GCP labels are lower-case
		"prod_eu":                              false, // not in a kvm mark volume's name
		"prod.eu":                              false,
		"-prod":                                false,
		"prod-":                                false,
		strings.Repeat("a", 64):                false,
	} {
		if err := CheckInstallationID(id); (err == nil) != ok {
			t.Errorf("CheckInstallationID(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}
