//go:build cluster

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/node"
)

// TestClusterUpAndDownLeaveNothingBehind does what make cluster and make
// cluster-down do (hack/cluster.sh, with this test binary as the one make
// cluster builds): up returns with the demo running and the cluster still
// up after it; bin/cluster/kubectl reaches the API server from the
// machine's network namespace, and so does any kubectl given the
// kubeconfig; bin/cluster/exec runs a command in the cluster's network
// namespace (curl reaches the site's pod IP); the crawler image has curl,
// python3 and requests. After down the cluster's process and network
// namespace are gone, and the machine's interfaces, named network
// namespaces, mounts, iptables rules, kernel settings and cgroups are as
// they were.
func TestClusterUpAndDownLeaveNothingBehind(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("make cluster needs root (network, mount and PID namespaces, cgroups); run the cluster tests as root")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	nodeBins := os.Getenv("PROXYFLEET_NODE_BINS")
	if nodeBins == "" {
		nodeBins = filepath.Join(root, "bin", "node")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "hack", "cluster.sh")
	before, err := node.ReadHostState()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	down := func() (string, error) {
		out, err := exec.Command(script, "down", dir).CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(dir, "pid")); err == nil {
			if out, err := down(); err != nil {
				t.Errorf("hack/cluster.sh down (cleanup): %v\n%s", err, out)
			}
		}
	})
	up, err := exec.Command(script, "up", dir, exe, nodeBins).CombinedOutput()
	if err != nil {
		t.Fatalf("hack/cluster.sh up: %v\n%s", err, up)
	}
	t.Logf("hack/cluster.sh up:\n%s", up)
	if !strings.Contains(string(up), "bin/cluster/kubectl") || !strings.Contains(string(up), "make cluster-down removes it") {
		t.Errorf("make cluster did not print how to reach the cluster:\n%s", up)
	}
	readPID := func(name string) int {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return pid
	}
	pid, netnsPID := readPID("pid"), readPID("netns.pid")
	netns, err := os.Readlink("/proc/" + strconv.Itoa(netnsPID) + "/ns/net")
	if err != nil {
		t.Fatal(err)
	}

	run := func(env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s\nthe cluster's log ends:\n%s", name, strings.Join(args, " "), err, out, tailOf(filepath.Join(dir, "cluster.log"), 40))
		}
		return strings.TrimSpace(string(out))
	}
	kubectl := filepath.Join(dir, "kubectl")
	if got := run(nil, kubectl, "-n", demoEgressNS, "get", "pods", "-l", "app.kubernetes.io/managed-by=proxyfleet", "-o", "jsonpath={.items[*].status.phase}"); got != "Running Running Running" {
		t.Errorf("the Squid pods of pool demo: %q, want three Running", got)
	}
	if got := run(nil, kubectl, "-n", "proxyfleet-system", "get", "deploy", "proxyfleet", "-o", "jsonpath={.status.availableReplicas}"); got != "1" {
		t.Errorf("the controller Deployment has %q available replicas, want 1", got)
	}
	// Any kubectl, given the kubeconfig.
	if got := run([]string{"KUBECONFIG=" + filepath.Join(dir, "kubeconfig")}, filepath.Join(nodeBins, "kubectl"), "get", "nodes", "-o", "name"); got != "node/"+node.NodeName {
		t.Errorf("kubectl with the kubeconfig: %q, want node/%s", got, node.NodeName)
	}
	sitePodIP := run(nil, kubectl, "-n", demoSitesNS, "get", "pod", "site", "-o", "jsonpath={.status.podIP}")
	if got := run(nil, filepath.Join(dir, "exec"), "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20",
		"http://"+sitePodIP+":"+strconv.Itoa(clusterSitePort)+"/"); got != "200" {
		t.Errorf("bin/cluster/exec curl of the site's pod IP %s: %q, want 200", sitePodIP, got)
	}
	if got := run(nil, kubectl, "-n", demoCrawlersNS, "exec", "deploy/"+demoCrawlerName, "-c", "crawler", "--",
		"python3", "-c", "import requests, shutil; print(requests.__name__, shutil.which('curl'))"); got != "requests /usr/bin/curl" {
		t.Errorf("the crawler image: %q, want python3 with requests and curl", got)
	}

	if out, err := down(); err != nil {
		t.Fatalf("hack/cluster.sh down: %v\n%s", err, out)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("the cluster's process %d still runs after down", pid)
	}
	if out, err := exec.Command("lsns", "-t", "net", "-n", "-o", "NS").CombinedOutput(); err != nil {
		t.Errorf("lsns: %v\n%s", err, out)
	} else if ino := strings.TrimSuffix(strings.TrimPrefix(netns, "net:["), "]"); slices.Contains(strings.Fields(string(out)), ino) {
		t.Errorf("the cluster's network namespace %s is left after down", netns)
	}
	after, err := node.ReadHostState()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range before.Changes(after, node.CgroupRoot(pid)) {
		t.Errorf("make cluster-down left %s", c)
	}
	for _, f := range []string{"pid", "netns.pid", "kubeconfig", "ready"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("bin/cluster/%s is left after down", f)
		}
	}
}

// tailOf is the last n lines of the file at path.
func tailOf(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
