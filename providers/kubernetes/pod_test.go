package kubernetes

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/proxyfleet/proxyfleet/providers"
)

func testRequest() providers.CreateRequest {
	return providers.CreateRequest{
		Name:           providers.NameFromUID("uid-1"),
		OwnerUID:       "uid-1",
		OwnerName:      "eu-1",
		OwnerNamespace: "crawl",
		Installation:   "cluster-a",
		Port:           3128,
		Labels:         map[string]string{"tier": "dc", LabelOwnerUID: "spoofed", LabelInstallation: "spoofed"},
	}
}

func TestBuildPod(t *testing.T) {
	cfg := Config{Namespace: "egress", Image: DefaultImage}
	req := testRequest()
	pod, err := buildPod(cfg, req)
	if err != nil {
		t.Fatalf("buildPod: %v", err)
	}
	c := pod.Spec.Containers[0]
	checks := []struct {
		what string
		ok   bool
	}{
		{"name is the request's", pod.Name == req.Name},
		{"namespace is the configured one", pod.Namespace == "egress"},
		{"managed-by label", pod.Labels[LabelManagedBy] == "proxyfleet"},
		{"owner UID label, not the spoofed extra label", pod.Labels[LabelOwnerUID] == "uid-1"},
		{"owner name label", pod.Labels[LabelOwnerName] == "eu-1"},
		{"installation label, not the spoofed extra label", pod.Labels[LabelInstallation] == "cluster-a"},
		{"the instance read back carries the installation", instanceOf(pod).Installation == "cluster-a"},
		{"extra labels kept", pod.Labels["tier"] == "dc"},
		{"owner annotation", pod.Annotations[AnnotationOwner] == "crawl/eu-1"},
		{"squid.conf annotation listens on the port", strings.Contains(pod.Annotations[AnnotationSquidConf], "\nhttp_port 3128\n")},
		{"image is the configured one", c.Image == DefaultImage},
		{"command runs squid in the foreground on the projected file", strings.Join(c.Command, " ") == "/usr/sbin/squid -N -d 1 -f /etc/proxyfleet/squid.conf"},
		{"container port", len(c.Ports) == 1 && c.Ports[0].ContainerPort == 3128},
		{"readiness probe on the port", c.ReadinessProbe != nil && c.ReadinessProbe.TCPSocket.Port.IntValue() == 3128},
		{"liveness probe on the port", c.LivenessProbe != nil && c.LivenessProbe.TCPSocket.Port.IntValue() == 3128},
		{"non-root pod", *pod.Spec.SecurityContext.RunAsNonRoot && *pod.Spec.SecurityContext.RunAsUser == 13},
		{"seccomp runtime default", pod.Spec.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
		{"no sysctl for a high port", len(pod.Spec.SecurityContext.Sysctls) == 0},
		{"no privilege escalation", !*c.SecurityContext.AllowPrivilegeEscalation},
		{"read-only root", *c.SecurityContext.ReadOnlyRootFilesystem},
		{"all capabilities dropped", len(c.SecurityContext.Capabilities.Drop) == 1 && c.SecurityContext.Capabilities.Drop[0] == "ALL"},
		{"no service account token", !*pod.Spec.AutomountServiceAccountToken},
		{"small limits", c.Resources.Limits.Memory().String() == "256Mi" && c.Resources.Limits.Cpu().String() == "1"},
		{"small requests", c.Resources.Requests.Cpu().String() == "20m" && c.Resources.Requests.Memory().String() == "48Mi"},
		{"config projected from the annotation", pod.Spec.Volumes[0].DownwardAPI.Items[0].FieldRef.FieldPath == "metadata.annotations['proxyfleet.io/squid-conf']"},
		{"config mounted read-only", c.VolumeMounts[0].MountPath == "/etc/proxyfleet" && c.VolumeMounts[0].ReadOnly},
		{"writable /tmp", c.VolumeMounts[1].MountPath == "/tmp" && pod.Spec.Volumes[1].EmptyDir != nil},
		{"no node selector without placement", pod.Spec.NodeSelector == nil},
	}
	for _, ch := range checks {
		if !ch.ok {
			t.Errorf("%s: not so in\n%+v", ch.what, pod)
		}
	}
}

// TestBuildPodAdmitsTheClusterTargets: the squid.conf of a provider given
// cluster targets no longer denies them, and still denies the rest of the
// private ranges.
func TestBuildPodAdmitsTheClusterTargets(t *testing.T) {
	pod, err := buildPod(Config{Namespace: "egress", ClusterTargets: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}}, testRequest())
	if err != nil {
		t.Fatal(err)
	}
	conf := pod.Annotations[AnnotationSquidConf]
	want := "acl proxyfleet_denied dst 0.0.0.0/8 10.0.0.0/9 10.128.0.0/10 10.192.0.0/11 10.224.0.0/12 10.240.0.0/14 10.244.1.0/24 10.244.2.0/23 "
	if !strings.Contains(conf, "\n"+want) {
		t.Errorf("squid.conf does not cut 10.244.0.0/24 out of 10.0.0.0/8 (want %q):\n%s", want, conf)
	}
	if _, err := New(fake.NewClientBuilder().Build(), Config{Namespace: "egress", ClusterTargets: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}); err == nil || !strings.Contains(err.Error(), "203.0.113.0/24") {
		t.Errorf("New admitted a public range as a cluster target: %v", err)
	}
}

func TestBuildPodPlacement(t *testing.T) {
	req := testRequest()
	req.Placement = providers.Placement{Zone: "europe-west1-b", MachineType: "e2-small", Image: "registry.local/squid:7@sha256:" + strings.Repeat("a", 64)}
	req.Port = 80
	pod, err := buildPod(Config{Namespace: "egress", Image: DefaultImage}, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Spec.NodeSelector; got[corev1.LabelTopologyZone] != "europe-west1-b" || got[corev1.LabelInstanceTypeStable] != "e2-small" {
		t.Errorf("node selector %v", got)
	}
	if pod.Spec.Containers[0].Image != req.Placement.Image {
		t.Errorf("placement.image did not override the image: %s", pod.Spec.Containers[0].Image)
	}
	if s := pod.Spec.SecurityContext.Sysctls; len(s) != 1 || s[0].Name != "net.ipv4.ip_unprivileged_port_start" || s[0].Value != "0" {
		t.Errorf("a port below 1024 needs the unprivileged-port sysctl, got %v", s)
	}
}

func TestBuildPodLongOwnerNameOnlyAnnotated(t *testing.T) {
	req := testRequest()
	req.OwnerName = strings.Repeat("a", 70)
	pod, err := buildPod(Config{Namespace: "egress", Image: DefaultImage}, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pod.Labels[LabelOwnerName]; ok {
		t.Error("a 70-character name was put in a label (max 63)")
	}
	if pod.Annotations[AnnotationOwner] != "crawl/"+req.OwnerName {
		t.Errorf("owner annotation %q", pod.Annotations[AnnotationOwner])
	}
}

func TestBuildPodRejectsBadRequests(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*providers.CreateRequest)
		want   string
	}{
		{"name not a DNS label", func(r *providers.CreateRequest) { r.Name = "Proxy_1" }, `name "Proxy_1" is not a DNS-1123 label`},
		{"missing owner UID", func(r *providers.CreateRequest) { r.OwnerUID = "" }, "owner UID is required"},
		{"port zero", func(r *providers.CreateRequest) { r.Port = 0 }, "port 0 is not in 1-65535"},
		{"port too high", func(r *providers.CreateRequest) { r.Port = 70000 }, "port 70000 is not in 1-65535"},
		{"image with a space", func(r *providers.CreateRequest) { r.Placement.Image = "squid latest" }, `placement.image "squid latest"`},
		{"zone not a label value", func(r *providers.CreateRequest) { r.Placement.Zone = "eu west" }, `placement.zone "eu west"`},
		{"bad label key", func(r *providers.CreateRequest) { r.Labels = map[string]string{"a b": "x"} }, `label key "a b"`},
		{"bad label value", func(r *providers.CreateRequest) { r.Labels = map[string]string{"tier": "d c"} }, `label tier value "d c"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := testRequest()
			tt.mutate(&req)
			_, err := buildPod(Config{Namespace: "egress", Image: DefaultImage}, req)
			if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want ErrPermanent saying %q", err, tt.want)
			}
		})
	}
}

func TestStateOf(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name     string
		phase    corev1.PodPhase
		ip       string
		deleting bool
		want     providers.State
	}{
		{"no status yet is provisioning", "", "", false, providers.StateProvisioning},
		{"pending is provisioning", corev1.PodPending, "", false, providers.StateProvisioning},
		{"pending with an IP is still provisioning", corev1.PodPending, "10.0.0.5", false, providers.StateProvisioning},
		{"running with an IP is running", corev1.PodRunning, "10.0.0.5", false, providers.StateRunning},
		{"running without an IP is provisioning", corev1.PodRunning, "", false, providers.StateProvisioning},
		{"succeeded is terminated", corev1.PodSucceeded, "", false, providers.StateTerminated},
		{"failed is stopped", corev1.PodFailed, "10.0.0.5", false, providers.StateStopped},
		{"unknown is provisioning", corev1.PodUnknown, "10.0.0.5", false, providers.StateProvisioning},
		{"a future phase is stopped", corev1.PodPhase("Hibernating"), "", false, providers.StateStopped},
		{"being deleted is terminated even while running", corev1.PodRunning, "10.0.0.5", true, providers.StateTerminated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Status: corev1.PodStatus{Phase: tt.phase, PodIP: tt.ip}}
			if tt.deleting {
				pod.DeletionTimestamp = &now
			}
			if got := stateOf(pod); got != tt.want {
				t.Fatalf("stateOf = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestInstanceOf(t *testing.T) {
	created := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "proxy-abc", Namespace: "egress", CreationTimestamp: created,
			Labels: map[string]string{LabelOwnerUID: "uid-1"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3"},
	}
	want := providers.Instance{ProviderID: "kubernetes://egress/proxy-abc", Name: "proxy-abc", State: providers.StateRunning,
		IP: "10.1.2.3", OwnerUID: "uid-1", CreatedAt: created.Time}
	if got := instanceOf(pod); !reflect.DeepEqual(got, want) {
		t.Fatalf("instanceOf = %+v, want %+v", got, want)
	}
}
