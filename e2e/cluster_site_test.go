//go:build cluster

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyfleet/proxyfleet/controller/inject"
	"github.com/proxyfleet/proxyfleet/internal/testkit/node"
)

// clusterSitePort is where the site in the cluster listens; its Service
// answers on port 80.
const clusterSitePort = 8080

// clusterSiteScript is the site: Python's http.server answering every GET
// 200 with who asked for what, and logging each request's source address.
const clusterSiteScript = `import http.server, sys
class Site(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from the site: %s asked for %s\n" % (self.client_address[0], self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("", int(sys.argv[1])), Site).serve_forever()
`

// startClusterSite runs a small site in the cluster: pod "site" of the
// crawler image serving clusterSiteScript behind Service "site" (port 80) in namespace ns, never
// injected. It returns the Service's ClusterIP and the pod's IP, both
// private: only gateways and Squids that admit the cluster's ranges
// (clusterTargets.cidrs) reach them.
func startClusterSite(t *testing.T, c *node.Cluster, ns string) (serviceIP, podIP string) {
	t.Helper()
	ctx := context.Background()
	c.CreateNamespace(t, ns, nil)
	labels := map[string]string{"app": "site", inject.LabelInject: "false"}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "site", Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{
				Name: "site", Image: node.CrawlerImageRef, ImagePullPolicy: corev1.PullNever,
				// -u: each request's log line reaches the pod's log at once.
				Command:        []string{"python3", "-u", "-c", clusterSiteScript, fmt.Sprint(clusterSitePort)},
				Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: clusterSitePort}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(clusterSitePort)}}, PeriodSeconds: 2},
			}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "site", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "site"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(clusterSitePort)}}},
	}
	created, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	running := c.WaitPodRunning(t, ns, "site", clusterTimeout)
	return created.Spec.ClusterIP, running.Status.PodIP
}

// siteHit is one request the site in the cluster logged.
type siteHit struct{ source, path string }

// clusterSiteHits reads the requests the site in namespace ns logged
// (http.server's "SOURCE - - [time] "GET PATH HTTP/1.1" status -" lines).
func clusterSiteHits(t *testing.T, c *node.Cluster, ns string) []siteHit {
	t.Helper()
	raw, err := c.Client.CoreV1().Pods(ns).GetLogs("site", &corev1.PodLogOptions{Container: "site"}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("the site's log: %v", err)
	}
	var hits []siteHit
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) < 7 || !strings.HasPrefix(f[5], `"`) {
			continue
		}
		hits = append(hits, siteHit{source: f[0], path: f[6]})
	}
	return hits
}
