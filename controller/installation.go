package controller

import (
	"context"
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// InstallationNamespace is the namespace whose UID identifies a cluster:
// every cluster has it from its first start, and it is never recreated.
const InstallationNamespace = "kube-system"

// installationPattern is what an installation ID may be: a value every
// backend can carry as it is (a Kubernetes and a GCP label value, a kvm mark
// volume's name), so one ID means the same on all of them.
var installationPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// CheckInstallationID says why id cannot be an installation ID.
func CheckInstallationID(id string) error {
	if !installationPattern.MatchString(id) {
		return fmt.Errorf("%q is not an installation ID: 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit", id)
	}
	return nil
}

// InstallationID returns this cluster's installation ID: the UID of its
// kube-system namespace. Two controllers in different clusters sharing a
// cloud project or a hypervisor get different IDs without configuration,
// so neither one's orphan GC takes the other's instances for its own.
func InstallationID(ctx context.Context, r client.Reader) (string, error) {
	var ns corev1.Namespace
	if err := r.Get(ctx, types.NamespacedName{Name: InstallationNamespace}, &ns); err != nil {
		return "", fmt.Errorf("reading namespace %s, whose UID is this installation's ID: %w", InstallationNamespace, err)
	}
	id := string(ns.UID)
	if err := CheckInstallationID(id); err != nil {
		return "", fmt.Errorf("namespace %s's UID: %w", InstallationNamespace, err)
	}
	return id, nil
}
