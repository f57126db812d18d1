package node

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CoreDNSImageRef names the cluster DNS image Start builds from
// bin/node/coredns (CoreDNS from its Go module, e2e/tools/coredns).
const CoreDNSImageRef = "proxyfleet.local/coredns:dev"

// dnsManifest is the cluster DNS as kubeadm installs it, trimmed to one
// replica: CoreDNS's service account and read-only role, its Corefile, a
// Deployment and the kube-dns Service at ClusterDNS. The upstream for
// names outside the cluster is the node's resolv.conf, which has nothing:
// the namespace has no way out.
const dnsManifest = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        cache 30
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      containers:
      - name: coredns
        image: ` + CoreDNSImageRef + `
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
        livenessProbe: {httpGet: {path: /health, port: 8080}, periodSeconds: 10, failureThreshold: 5}
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: ` + ClusterDNS + `
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
`

// startDNS imports the CoreDNS image, applies dnsManifest and waits until
// the kube-dns Service answers for kubernetes.default.
func (c *Cluster) startDNS() {
	c.t.Helper()
	dir := c.t.TempDir()
	layer := filepath.Join(dir, "layer.tar")
	if err := tarFiles(layer, map[string]string{"coredns": filepath.Join(c.Bins, "coredns")}); err != nil {
		c.t.Fatal(err)
	}
	archive := filepath.Join(dir, "coredns.tar")
	if err := WriteImage(archive, CoreDNSImageRef, layer, ImageConfig{Entrypoint: []string{"/coredns"}}); err != nil {
		c.t.Fatalf("node: the CoreDNS image: %v", err)
	}
	c.ImportImage(archive)
	if err := c.Apply(dnsManifest); err != nil {
		c.t.Fatalf("node: the cluster DNS: %v", err)
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, ClusterDNS+":53")
	}}
	c.waitFor("kubelet", "the cluster DNS to answer for kubernetes.default.svc.cluster.local", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		addrs, err := r.LookupHost(ctx, "kubernetes.default.svc.cluster.local")
		if err != nil {
			return fmt.Errorf("%v\n%s", err, c.DescribePods("kube-system"))
		}
		if len(addrs) != 1 || addrs[0] != firstServiceIP().String() {
			return fmt.Errorf("kubernetes.default is %v, want %s", addrs, firstServiceIP())
		}
		return nil
	})
}

// Apply creates the objects of a multi-document YAML manifest with
// server-side apply, as `kubectl apply --server-side` does.
func (c *Cluster) Apply(manifest string) error {
	f, err := os.CreateTemp(c.t.TempDir(), "manifest-*.yaml")
	if err != nil {
		return err
	}
	if _, err := f.WriteString(manifest); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	out, err := c.kubectl("apply", "--server-side", "-f", f.Name())
	if err != nil {
		return fmt.Errorf("kubectl apply: %v\n%s", err, out)
	}
	return nil
}
