//go:build cluster

package node

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// TestNodeRunsAPodAndLeavesNothingBehind brings the node up, runs one pod
// of the pause image to Running with an address of the pod range, and,
// once the node is gone, finds the machine's interfaces, namespaces,
// mounts, iptables rules, kernel settings and processes as they were and
// the kubelet's cgroups removed.
func TestNodeRunsAPodAndLeavesNothingBehind(t *testing.T) {
	if !testutil.InNamespacesChild(t) {
		before, err := ReadHostState()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// Registered first, so it runs after InNamespaces' own cleanup
			// has put the settings back and removed the cgroups.
			after, err := ReadHostState()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range before.Changes(after, cgroupRootName()) {
				t.Errorf("the node left %s", c)
			}
		})
	}
	if !InNamespaces(t) {
		return
	}
	c := Start(t)
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pause", Namespace: "default"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "pause", Image: PauseImageRef, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := c.WaitPodRunning(t, "default", "pause", 3*time.Minute)
	ip, err := netip.ParseAddr(got.Status.PodIP)
	if err != nil || !netip.MustParsePrefix(PodCIDR).Contains(ip) {
		t.Fatalf("pod IP %q, want one of %s", got.Status.PodIP, PodCIDR)
	}
	if out := c.Ctr(t, "tasks", "list"); !strings.Contains(out, "RUNNING") {
		t.Fatalf("containerd runs no task for the pod:\n%s", out)
	}
}
