// Package node runs a real single-node Kubernetes cluster for a test, on
// this machine, offline and without Docker: etcd and kube-apiserver (the
// envtest builds, bin/k8s), kube-controller-manager, kube-scheduler,
// kubelet, kube-proxy in iptables mode and kubectl (hack/node-bins.sh,
// bin/node), Debian's containerd and runc, and the CNI bridge, host-local,
// loopback and portmap plugins of Debian's containernetworking-plugins.
//
// Everything lives in namespaces the test makes (InNamespaces): a network
// namespace (the node's address, the pod bridge, its veths and kube-proxy's
// rules), a mount namespace (containerd's and the kubelet's mounts, the
// node's state on a tmpfs) and a PID namespace (containers, shims). When
// the test ends the kernel removes all of it; what is machine-wide (the
// kernel settings the kubelet writes, the kubelet's cgroups) is put back
// by the parent side of InNamespaces.
//
// Images come from archives the test builds (PauseImage, ImageFromRootfs)
// and ImportImage loads into the node; pods use imagePullPolicy: Never.
//
// It imports internal/testutil (the namespaces), client-go and
// go-containerregistry (image archives), and nothing of the product.
package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

// The cluster's fixed addresses. The network namespace is the test's own,
// so its ports and ranges are free by construction.
const (
	// NodeName is the one node's name.
	NodeName = "node1"
	// NodeIP is the node's address: the address of the interface carrying
	// the namespace's default route (testutil.NetNSDefaultAddr); the
	// kubelet refuses the loopback the machine's host name resolves to.
	NodeIP = testutil.NetNSDefaultAddr
	// PodCIDR is the range the CNI bridge gives pods their addresses from.
	PodCIDR = "10.244.0.0/24"
	// ServiceCIDR is the Service cluster IP range.
	ServiceCIDR = "10.96.0.0/16"
	// ClusterDNS is the address the kubelet writes into pods' resolv.conf.
	ClusterDNS = "10.96.0.10"
	// APIServerPort is kube-apiserver's secure port on every address.
	APIServerPort = 6443
	// PauseImageRef names the sandbox image PauseImage builds.
	PauseImageRef = "proxyfleet.local/pause:dev"

	bridgeName = "cni0"
	etcdAddr   = "127.0.0.1:2379"

	cgroupRootEnv = "PROXYFLEET_NODE_CGROUP_ROOT"
	binDirEnv     = "PROXYFLEET_NODE_BINS"
	// startTimeout bounds each component's start: CI is a busy 2-core machine.
	startTimeout = 3 * time.Minute
)

// Cluster is a running single-node cluster.
type Cluster struct {
	// Dir holds the node's state (a tmpfs): certificates, kubeconfigs,
	// etcd's data, containerd's store, the kubelet's root, logs/.
	Dir string
	// Kubeconfig is the path of a cluster-admin kubeconfig.
	Kubeconfig string
	// Config reaches the API server as cluster admin.
	Config *rest.Config
	// Client is a client-go clientset over Config.
	Client kubernetes.Interface
	// CAFile is the cluster CA's certificate.
	CAFile string
	// Bins is the directory of the kube binaries (kubectl among them).
	Bins string

	t             testing.TB
	logDir        string
	procs         []*proc
	containerdSck string
}

// InNamespaces runs the calling top-level test in network, mount and PID
// namespaces of its own (testutil.InNamespaces) and returns true there,
// where the test goes on to Start the cluster; in the parent it returns
// false once the child is done, after putting back the kernel settings the
// kubelet changed and removing the cgroups it made. Nodes on one machine
// take turns (a lock file in the temp directory), as the kernel settings
// are the machine's:
//
//	if !node.InNamespaces(t) {
//		return
//	}
//	c := node.Start(t)
func InNamespaces(t *testing.T) bool {
	t.Helper()
	if testutil.InNamespacesChild(t) {
		return testutil.InNamespaces(t, testutil.Namespaces{MountAndPID: true})
	}
	// One node at a time on the machine: the kernel settings are
	// machine-wide, so a node whose test began while another node's
	// kubelet had changed them would save, and later put back, the
	// kubelet's values (two packages' tests run at once under go test).
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "proxyfleet-node.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		// Say why a test stands still: a `make cluster` node holds the
		// lock until `make cluster-down`.
		t.Logf("node: waiting for the machine's other node to end (a test's, or make cluster's until make cluster-down; lock %s)", lock.Name())
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			t.Fatalf("node: waiting for the machine's other node: %v", err)
		}
	}
	saved := readSysctls()
	root := cgroupRootName()
	t.Setenv(cgroupRootEnv, root)
	t.Cleanup(func() {
		defer lock.Close() // releases the lock
		if err := restoreSysctls(saved); err != nil {
			t.Errorf("node: putting back the kernel settings: %v", err)
		}
		if err := removeCgroups(root); err != nil {
			t.Errorf("node: removing the node's cgroups: %v", err)
		}
	})
	return testutil.InNamespaces(t, testutil.Namespaces{MountAndPID: true})
}

// Start brings the cluster up in the namespaces InNamespaces made and
// returns once the node is Ready, kube-proxy has programmed the kubernetes
// Service and the default namespace has its service account. Every
// component stops when the test ends. A component that does not come up
// fails the test with the tail of its own log.
func Start(t *testing.T) *Cluster {
	t.Helper()
	if os.Getpid() != 1 || os.Getenv(cgroupRootEnv) == "" {
		t.Fatal("node: Start runs in the namespaces node.InNamespaces makes (call it first)")
	}
	bins, k8sBins := binDirs(t)
	base := t.TempDir()
	c := &Cluster{t: t, Bins: bins}
	// The node's state goes on a tmpfs of the mount namespace, and /run
	// and /var/log too (containerd's shim sockets and runc's state are
	// under /run/containerd whatever its config says; the CNI plugins pin
	// pod network namespaces under /run/netns; the kubelet links container
	// logs from /var/log/containers): nothing of them reaches the
	// machine's disk, and all of it goes with the namespace.
	for _, m := range []struct{ dir, size string }{{base, "8g"}, {"/run", "256m"}, {"/var/log", "512m"}} {
		if err := syscall.Mount("tmpfs", m.dir, "tmpfs", 0, "size="+m.size+",mode=0755"); err != nil {
			t.Fatalf("node: mounting a tmpfs on %s: %v", m.dir, err)
		}
	}
	t.Cleanup(func() {
		// Before t.TempDir's removal: detach, so nothing is removed
		// through a mount a container still holds.
		_ = syscall.Unmount(base, syscall.MNT_DETACH)
	})
	c.Dir = base
	c.logDir = filepath.Join(base, "logs")
	for _, d := range []string{c.logDir, c.path("pki"), c.path("cni/net.d"), c.path("cni/ipam")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(c.teardown)
	// Shims re-parented to us (we are the PID namespace's init) are reaped,
	// or containerd would see their zombies as alive.
	stopReaper := make(chan struct{})
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopReaper:
				return
			case <-tick.C:
				reapOrphans()
			}
		}
	}()
	t.Cleanup(func() { close(stopReaper) })

	for _, kv := range [][2]string{
		{"net/ipv4/ip_forward", "1"},
		// Pod-to-Service traffic between two pods of the same bridge must
		// pass kube-proxy's rules.
		{"net/bridge/bridge-nf-call-iptables", "1"},
	} {
		if err := os.WriteFile("/proc/sys/"+kv[0], []byte(kv[1]), 0o644); err != nil {
			t.Fatalf("node: sysctl %s=%s in the namespace: %v", kv[0], kv[1], err)
		}
	}

	pki := c.path("pki")
	authority, err := newCA(pki)
	if err != nil {
		t.Fatal(err)
	}
	c.CAFile = authority.File
	issue := func(name, cn string, orgs []string, ips []net.IP, dns []string) *keyPair {
		kp, err := authority.issue(pki, name, cn, orgs, ips, dns)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	kubernetesSvcIP := firstServiceIP()
	serving := issue("apiserver", "kube-apiserver", nil,
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(NodeIP), kubernetesSvcIP},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	admin := issue("admin", "admin", []string{"system:masters"}, nil, nil)
	kubeletClient := issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil)
	saKey, saPub, err := writeServiceAccountKeys(pki)
	if err != nil {
		t.Fatal(err)
	}
	server := fmt.Sprintf("https://%s:%d", NodeIP, APIServerPort)
	writeKubeconfig := func(name string, kp *keyPair) string {
		p := c.path(name + ".kubeconfig")
		if err := os.WriteFile(p, authority.kubeconfig(server, kp), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c.Kubeconfig = writeKubeconfig("admin", admin)

	c.start("etcd", filepath.Join(k8sBins, "etcd"),
		"--data-dir", c.path("etcd"),
		"--listen-client-urls", "http://"+etcdAddr, "--advertise-client-urls", "http://"+etcdAddr,
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380",
		// The data is a tmpfs that dies with the test.
		"--unsafe-no-fsync")
	c.waitFor("etcd", "etcd to accept connections", func() error { return dial(etcdAddr) })

	c.start("kube-apiserver", filepath.Join(k8sBins, "kube-apiserver"),
		"--etcd-servers", "http://"+etcdAddr,
		"--bind-address", "0.0.0.0", "--advertise-address", NodeIP, fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--cert-dir", c.path("apiserver-certs"),
		"--tls-cert-file", serving.CertFile, "--tls-private-key-file", serving.KeyFile,
		"--client-ca-file", authority.File,
		"--kubelet-client-certificate", kubeletClient.CertFile, "--kubelet-client-key", kubeletClient.KeyFile,
		// The node's name resolves nowhere (the namespace has no DNS
		// for it): reach the kubelet (logs, exec, port-forward) by its
		// address.
		"--kubelet-preferred-address-types", "InternalIP",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", ServiceCIDR,
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged=true")
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	c.Config = cfg
	c.Client = kubernetes.NewForConfigOrDie(cfg)
	c.waitFor("kube-apiserver", "kube-apiserver to be ready", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%v: %s", err, body)
		}
		return nil
	})

	c.start("kube-controller-manager", filepath.Join(bins, "kube-controller-manager"),
		"--kubeconfig", writeKubeconfig("controller-manager", issue("controller-manager", "system:kube-controller-manager", nil, nil, nil)),
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port=10257",
		"--root-ca-file", authority.File,
		"--service-account-private-key-file", saKey,
		"--service-cluster-ip-range", ServiceCIDR,
		// Each controller under its own service account, with the roles
		// the API server bootstraps for it (system:controller:*), as
		// kubeadm runs it: the controller manager's own user may do
		// little more than that.
		"--use-service-account-credentials=true")
	c.start("kube-scheduler", filepath.Join(bins, "kube-scheduler"),
		"--kubeconfig", writeKubeconfig("scheduler", issue("scheduler", "system:kube-scheduler", nil, nil, nil)),
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port=10259")

	c.startContainerd()
	pause := PauseImage(t)
	c.ImportImage(pause)

	c.startKubelet(writeKubeconfig("kubelet", issue("kubelet", "system:node:"+NodeName, []string{"system:nodes"}, nil, nil)), authority.File)
	c.waitFor("kubelet", "node "+NodeName+" to be Ready", func() error {
		n, err := c.Client.CoreV1().Nodes().Get(context.Background(), NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("condition Ready=%s: %s", cond.Status, cond.Message)
			}
		}
		return errors.New("no Ready condition yet")
	})

	c.startKubeProxy(writeKubeconfig("kube-proxy", issue("kube-proxy", "system:kube-proxy", nil, nil, nil)))
	c.waitFor("kube-proxy", "kube-proxy to program the kubernetes Service", func() error {
		out, err := exec.Command("iptables-save", "-t", "nat").CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables-save: %v: %s", err, out)
		}
		if !strings.Contains(string(out), "default/kubernetes:https") {
			return errors.New("no rule for default/kubernetes yet")
		}
		return nil
	})
	c.waitFor("kube-controller-manager", "the default service account and kube-root-ca.crt", func() error {
		ctx := context.Background()
		if _, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		_, err := c.Client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})
	c.startDNS()
	return c
}

// cgroupRootName is the kubelet's cgroupRoot for a node whose test's
// parent side is this process: one per test binary, so two test binaries
// (or `make cluster` beside a test) never share one.
func cgroupRootName() string { return CgroupRoot(os.Getpid()) }

// CgroupRoot is the kubelet's cgroupRoot (in every v1 hierarchy) of a node
// whose InNamespaces parent side is process pid.
func CgroupRoot(pid int) string { return fmt.Sprintf("proxyfleet-node-%d", pid) }

func (c *Cluster) path(rel string) string { return filepath.Join(c.Dir, rel) }

// start starts a component or fails the test.
func (c *Cluster) start(name, bin string, args ...string) *proc {
	c.t.Helper()
	p, err := startProc(c.logDir, name, bin, args...)
	if err != nil {
		c.t.Fatalf("node: %v", err)
	}
	c.procs = append(c.procs, p)
	return p
}

// waitFor polls cond until it holds, failing the test with the tail of
// component's log when it does not within startTimeout or when any
// component exits meanwhile.
func (c *Cluster) waitFor(component, what string, cond func() error) {
	c.t.Helper()
	deadline := time.Now().Add(startTimeout)
	var last error
	for {
		for _, p := range c.procs {
			if done, err := p.exited(); done {
				c.t.Fatalf("node: %s exited (%v) while waiting for %s; its log ends:\n%s", p.name, err, what, p.tail(60))
			}
		}
		if last = cond(); last == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node: no %s within %s: %v\n%s's log ends:\n%s", what, startTimeout, last, component, tailFile(filepath.Join(c.logDir, component+".log"), 60))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Logs is the tail of a component's log (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, containerd, kubelet,
// kube-proxy), for a test's failure message.
func (c *Cluster) Logs(component string, lines int) string {
	return tailFile(filepath.Join(c.logDir, component+".log"), lines)
}

// teardown stops the components, the node side first, then kills what is
// left in the PID namespace (containers and their shims).
func (c *Cluster) teardown() {
	if c.t.Failed() {
		for _, p := range c.procs {
			c.t.Logf("node: %s's log ends:\n%s", p.name, p.tail(40))
		}
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(15 * time.Second)
	}
	killNamespace()
}

func (c *Cluster) startContainerd() {
	c.t.Helper()
	c.containerdSck = c.path("containerd/containerd.sock")
	conf := c.path("containerd/config.toml")
	if err := os.MkdirAll(filepath.Dir(conf), 0o755); err != nil {
		c.t.Fatal(err)
	}
	// containerd 1.6 (Debian's), config version 2. restrict_oom_score_adj:
	// without CAP_SYS_RESOURCE the sandbox's negative oom_score_adj cannot
	// be written and runc would fail every pod.
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, c.path("containerd/root"), c.path("containerd/state"), c.containerdSck, PauseImageRef, c.path("cni/net.d"), c.path("containerd/opt"))
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		c.t.Fatal(err)
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "proxyfleet-node",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, bridgeName, PodCIDR, c.path("cni/ipam"))
	if err := os.WriteFile(c.path("cni/net.d/10-proxyfleet.conflist"), []byte(cni), 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.start("containerd", "/usr/bin/containerd", "--config", conf)
	c.waitFor("containerd", "containerd to answer", func() error {
		out, err := c.ctr("version")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}

// ctr runs Debian's ctr against the node's containerd, in the namespace
// the CRI plugin keeps the pods' images and containers in.
func (c *Cluster) ctr(args ...string) ([]byte, error) {
	return exec.Command("/usr/bin/ctr", append([]string{"--address", c.containerdSck, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
}

// Ctr runs ctr against the node's containerd (namespace k8s.io), failing
// the test when it fails; it returns the output.
func (c *Cluster) Ctr(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.ctr(args...)
	if err != nil {
		t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ImportImage loads an image archive (docker-archive or OCI) into the
// node's image store, where pods with imagePullPolicy: Never find it.
func (c *Cluster) ImportImage(archive string) {
	c.t.Helper()
	if out, err := c.ctr("images", "import", archive); err != nil {
		c.t.Fatalf("node: importing %s: %v\n%s\ncontainerd's log ends:\n%s", archive, err, out, c.Logs("containerd", 30))
	}
}

func (c *Cluster) startKubelet(kubeconfig, caFile string) {
	c.t.Helper()
	root := c.path("kubelet")
	conf := c.path("kubelet.yaml")
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine's cgroups are v1: kubelets from 1.35 refuse them unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
failSwapOn: false
# No CAP_SYS_RESOURCE: a negative oom_score_adj cannot be written.
oomScoreAdj: 0
containerRuntimeEndpoint: unix://%s
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
clusterDNS: [%s]
clusterDomain: cluster.local
resolvConf: %s
podLogsDir: %s
# The images come from archives imported by hand and cannot be pulled
# again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
serializeImagePulls: false
`, os.Getenv(cgroupRootEnv), c.containerdSck, NodeIP, caFile, ClusterDNS, c.path("resolv.conf"), c.path("pod-logs"))
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		c.t.Fatal(err)
	}
	// The pods' upstream resolver: nothing answers in the namespace, and
	// the machine's resolver is out of reach by design.
	if err := os.WriteFile(c.path("resolv.conf"), []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		c.t.Fatal(err)
	}
	if err := makeCgroupRoot(os.Getenv(cgroupRootEnv)); err != nil {
		c.t.Fatalf("node: the kubelet's cgroup root: %v", err)
	}
	c.start("kubelet", filepath.Join(c.Bins, "kubelet"),
		"--config", conf, "--kubeconfig", kubeconfig, "--root-dir", root, "--cert-dir", c.path("kubelet-pki"),
		"--hostname-override", NodeName, "--node-ip", NodeIP, "--v=2")
}

func (c *Cluster) startKubeProxy(kubeconfig string) {
	c.t.Helper()
	conf := c.path("kube-proxy.yaml")
	// conntrack maxPerCore 0 and zero timeouts: leave the conntrack
	// settings alone (nf_conntrack_max is machine-wide).
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: %s}
hostnameOverride: %s
clusterCIDR: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, NodeName, PodCIDR, NodeIP)
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.start("kube-proxy", filepath.Join(c.Bins, "kube-proxy"), "--config", conf, "--v=2")
}

// WaitPodRunning waits until the pod is Running with every container
// ready, failing the test with the pod's status, its events and the
// kubelet's log tail otherwise.
func (c *Cluster) WaitPodRunning(t testing.TB, namespace, name string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var pod *corev1.Pod
	var last error
	for time.Now().Before(deadline) {
		p, err := c.Client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		switch {
		case err != nil:
			last = err
		case p.Status.Phase == corev1.PodRunning && podReady(p):
			return p
		default:
			pod, last = p, fmt.Errorf("phase %s", p.Status.Phase)
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("node: pod %s/%s not running within %s: %v\n%s", namespace, name, timeout, last, c.describePod(namespace, name, pod))
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// describePod is what a failure shows about a pod: its container states,
// its events and the kubelet's and containerd's log tails.
func (c *Cluster) describePod(namespace, name string, pod *corev1.Pod) string {
	var b strings.Builder
	if pod != nil {
		for _, s := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, "container %s: ready=%v restarts=%d state=%+v last=%+v\n", s.Name, s.Ready, s.RestartCount, s.State, s.LastTerminationState)
		}
	}
	evs, err := c.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err == nil {
		for _, e := range evs.Items {
			fmt.Fprintf(&b, "event: %s %s: %s\n", e.Type, e.Reason, e.Message)
		}
	}
	fmt.Fprintf(&b, "kubelet's log ends:\n%s\ncontainerd's log ends:\n%s\n", c.Logs("kubelet", 40), c.Logs("containerd", 20))
	return b.String()
}

// CreateNamespace creates namespace name with labels, failing the test
// when it exists already.
func (c *Cluster) CreateNamespace(t testing.TB, name string, labels map[string]string) {
	t.Helper()
	_, err := c.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("node: namespace %s: %v", name, err)
	}
	// The service account controller makes "default" shortly after; a pod
	// created before it is refused.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := c.Client.CoreV1().ServiceAccounts(name).Get(context.Background(), "default", metav1.GetOptions{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node: namespace %s got no default service account: %v", name, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// Kubectl runs bin/node/kubectl against the cluster and returns its
// output, failing the test when it fails.
func (c *Cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.kubectl(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (c *Cluster) kubectl(args ...string) ([]byte, error) {
	return exec.Command(filepath.Join(c.Bins, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...).CombinedOutput()
}

// firstServiceIP is the kubernetes Service's address: the first of
// ServiceCIDR, which the API server's certificate must name.
func firstServiceIP() net.IP {
	p := netip.MustParsePrefix(ServiceCIDR)
	return net.IP(p.Addr().Next().AsSlice())
}

func dial(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	return conn.Close()
}

// binDirs finds the node binaries (bin/node, or $PROXYFLEET_NODE_BINS) and
// the envtest ones (bin/k8s), failing the test with how to build them.
func binDirs(t testing.TB) (bins, k8s string) {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins = os.Getenv(binDirEnv)
	if bins == "" {
		bins = filepath.Join(root, "bin", "node")
	}
	k8s = os.Getenv("KUBEBUILDER_ASSETS")
	if k8s == "" {
		k8s = filepath.Join(root, "bin", "k8s")
	}
	for _, f := range []string{filepath.Join(bins, "kubelet"), filepath.Join(bins, "kube-proxy"), filepath.Join(bins, "kube-scheduler"),
		filepath.Join(bins, "kube-controller-manager"), filepath.Join(bins, "kubectl"), filepath.Join(bins, "coredns")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("node: %v (make node-bins builds the node's binaries into bin/node)", err)
		}
	}
	for _, f := range []string{filepath.Join(k8s, "etcd"), filepath.Join(k8s, "kube-apiserver")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("node: %v (make envtest-bins builds etcd and kube-apiserver into bin/k8s)", err)
		}
	}
	for _, f := range []string{"/usr/bin/containerd", "/usr/bin/ctr", "/usr/sbin/runc", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", "/usr/lib/cni/portmap"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("node: %v (hack/install-deps.sh installs containerd, runc and containernetworking-plugins)", err)
		}
	}
	return bins, k8s
}

// DescribePods is what a failure shows about a namespace's pods: each
// pod's phase, address and container states, the namespace's events and
// the kubelet's log tail.
func (c *Cluster) DescribePods(namespace string) string {
	var b strings.Builder
	pods, err := c.Client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return fmt.Sprintf("listing pods in %s: %v", namespace, err)
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: %s ip=%s\n", p.Name, p.Status.Phase, p.Status.PodIP)
		for _, s := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "  container %s: ready=%v restarts=%d state=%+v last=%+v\n", s.Name, s.Ready, s.RestartCount, s.State, s.LastTerminationState)
		}
	}
	if evs, err := c.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{}); err == nil {
		for _, e := range evs.Items {
			fmt.Fprintf(&b, "event %s/%s: %s %s: %s\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
		}
	}
	fmt.Fprintf(&b, "kubelet's log ends:\n%s\n", c.Logs("kubelet", 40))
	return b.String()
}
