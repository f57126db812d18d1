//go:build cluster

package node

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// hostState is what a node must leave as it found it on the machine: the
// network interfaces, named network namespaces, mounts, iptables rules,
// kernel settings and the processes' commands.
type hostState struct {
	links, netns, mounts, iptables, procs string
	sysctls                               map[string]string
}

func readHostState(t *testing.T) hostState {
	t.Helper()
	run := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, l := range strings.Split(run("iptables-save"), "\n") {
		if !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, ":") { // comments carry times, chain lines counters
			rules = append(rules, l)
		}
	}
	var procs []string
	for _, l := range strings.Split(run("ps", "-eo", "args"), "\n") {
		for _, c := range []string{"containerd", "kubelet", "kube-", "etcd", "runc", "/pause"} {
			if strings.Contains(l, c) && strings.Contains(l, "proxyfleet-node") {
				procs = append(procs, l)
			}
		}
	}
	return hostState{
		links:    run("ip", "-o", "link", "show"),
		netns:    run("ip", "netns", "list"),
		mounts:   string(mounts),
		iptables: strings.Join(rules, "\n"),
		procs:    strings.Join(procs, "\n"),
		sysctls:  readSysctls(),
	}
}

// TestNodeRunsAPodAndLeavesNothingBehind brings the node up, runs one pod
// of the pause image to Running with an address of the pod range, and,
// once the node is gone, finds the machine's interfaces, namespaces,
// mounts, iptables rules, kernel settings and processes as they were and
// the kubelet's cgroups removed.
func TestNodeRunsAPodAndLeavesNothingBehind(t *testing.T) {
	if !testutil.InNamespacesChild(t) {
		before := readHostState(t)
		t.Cleanup(func() {
			// Registered first, so it runs after InNamespaces' own cleanup
			// has put the settings back and removed the cgroups.
			after := readHostState(t)
			for name, pair := range map[string][2]string{
				"network interfaces": {before.links, after.links},
				"network namespaces": {before.netns, after.netns},
				"mounts":             {before.mounts, after.mounts},
				"iptables rules":     {before.iptables, after.iptables},
				"node processes":     {before.procs, after.procs},
			} {
				if pair[0] != pair[1] {
					t.Errorf("the node left %s changed:\nbefore:\n%s\nafter:\n%s", name, pair[0], pair[1])
				}
			}
			for k, v := range before.sysctls {
				if after.sysctls[k] != v {
					t.Errorf("kernel setting %s is %s after the node, was %s", k, after.sysctls[k], v)
				}
			}
			root := cgroupRootName()
			for _, h := range cgroupHierarchies() {
				if _, err := os.Stat(h + "/" + root); err == nil {
					t.Errorf("the node's cgroup %s/%s is left", h, root)
				}
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
