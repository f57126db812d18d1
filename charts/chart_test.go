// Package charts_test checks the Helm chart with the Helm SDK (the code
// behind `helm lint` and `helm template`) and hands what it renders to a
// real kube-apiserver (envtest) with a server-side dry-run, so every
// manifest is known to be accepted by the API server's validation.
//
// It imports the Helm SDK, internal/testenv and the test kit; nothing of the
// product's code, since the chart is tested as a user installs it.
package charts_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/gateway/clients"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
)

const (
	releaseNS   = "proxyfleet-system"
	releaseName = "proxyfleet"
)

// chartDir is charts/proxyfleet.
func chartDir(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "charts", "proxyfleet")
}

// allOn turns every optional part of the chart on.
func allOn() map[string]any {
	return map[string]any{
		"controller": map[string]any{"proxyNamespace": "crawl", "gcAllowNamespaced": true, "replicas": 2, "defaultProbeURL": "http://probe.example/generate_204",
			"extraVolumes":      []any{map[string]any{"name": "kvm-ssh", "secret": map[string]any{"secretName": "kvm-ssh"}}},
			"extraVolumeMounts": []any{map[string]any{"name": "kvm-ssh", "mountPath": "/etc/proxyfleet/kvm-ssh", "readOnly": true}}},
		"leaseStore":    map[string]any{"url": "redis://redis.proxyfleet.svc:6379/0", "passwordSecret": "redis-password"},
		"providers":     map[string]any{"providers": []any{map[string]any{"name": "cluster", "type": "kubernetes", "kubernetes": map[string]any{"namespace": "squids"}}}},
		"leaseAPI":      map[string]any{"token": "a-static-token"},
		"webhook":       map[string]any{"certManager": map[string]any{"enabled": true}},
		"leaseUsers":    []any{map[string]any{"namespace": "crawl", "name": "crawler"}},
		"sharedGateway": map[string]any{"enabled": true},
		"sidecar":       map[string]any{"noProxy": []any{"10.96.0.0/12", "10.244.0.0/16"}},
		"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true},
			"grafanaDashboard": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}},
	}
}

// render is `helm template --include-crds` through the SDK.
func render(t *testing.T, vals map[string]any) (string, error) {
	t.Helper()
	ch, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatal(err)
	}
	return renderChart(ch, vals)
}

func renderChart(ch *chart.Chart, vals map[string]any) (string, error) {
	cfg := &action.Configuration{Releases: storage.Init(driver.NewMemory())}
	in := action.NewInstall(cfg)
	in.DryRun, in.ClientOnly, in.Replace, in.IncludeCRDs = true, true, true, true
	in.ReleaseName, in.Namespace = releaseName, releaseNS
	in.KubeVersion = &chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
	rel, err := in.Run(ch, vals)
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

// objects splits a rendered manifest into objects.
func objects(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatalf("rendered document is not YAML: %v\n%s", err, doc)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			return o
		}
	}
	return nil
}

func TestChartLints(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
	}{{"with the defaults", nil}, {"with every optional part on", allOn()}} {
		t.Run(tc.name, func(t *testing.T) {
			l := action.NewLint()
			l.Namespace = releaseNS
			res := l.Run([]string{chartDir(t)}, tc.vals)
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
			for _, err := range res.Errors {
				t.Errorf("helm lint: %v", err)
			}
		})
	}
}

func TestChartValuesSchemaRejectsMistakes(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"a string where replicas takes a number", map[string]any{"controller": map[string]any{"replicas": "two"}}, "replicas"},
		{"a misspelt key", map[string]any{"webhok": map[string]any{"enabled": false}}, "webhok"},
		{"an unknown failure policy", map[string]any{"webhook": map[string]any{"failurePolicy": "Sometimes"}}, "failurePolicy"},
		{"a lease user without a namespace", map[string]any{"leaseUsers": []any{map[string]any{"name": "crawler"}}}, "namespace"},
		{"a lease store that is neither memory nor Redis", map[string]any{"leaseStore": map[string]any{"url": "mysql://db:3306"}}, "url"},
		{"two replicas on the memory store", map[string]any{"controller": map[string]any{"replicas": 2}}, "leaseStore.url"},
		{"a cluster target in a public range", map[string]any{"clusterTargets": map[string]any{"cidrs": []any{"10.244.0.0/16", "203.0.113.0/24"}}}, "cidrs"},
		{"a cluster target that is no CIDR", map[string]any{"clusterTargets": map[string]any{"cidrs": []any{"10.96.0.0"}}}, "cidrs"},
		{"a default probe URL that is not http(s)", map[string]any{"controller": map[string]any{"defaultProbeURL": "www.gstatic.com/generate_204"}}, "defaultProbeURL"},
		{"a tenancy that is neither namespaced nor cluster-wide", map[string]any{"leaseAPI": map[string]any{"tenancy": "open"}}, "tenancy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render: %v, want a schema error naming %q", err, tc.want)
			}
		})
	}
}

// TestChartManifestsAreAcceptedByTheAPIServer renders the chart with the
// defaults and with everything on, checks what a broken chart would get
// wrong, and applies every object with a server-side dry-run against a real
// kube-apiserver. ServiceMonitor and cert-manager kinds are checked as
// rendered but not sent: this API server has no Prometheus Operator or
// cert-manager CRDs, and stand-ins for them would prove nothing.
func TestChartManifestsAreAcceptedByTheAPIServer(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	for _, ns := range []string{releaseNS, "crawl"} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	bin := testutil.BuildBinary(t)
	thirdParty := []string{"monitoring.coreos.com", "cert-manager.io"}

	for _, tc := range []struct {
		name      string
		vals      map[string]any
		wantKinds []string
	}{
		{"defaults", nil, []string{"CustomResourceDefinition", "Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Secret", "MutatingWebhookConfiguration"}},
		{"every optional part on", allOn(), []string{"ConfigMap", "ServiceMonitor", "Certificate", "Issuer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			manifest, err := render(t, tc.vals)
			if err != nil {
				t.Fatal(err)
			}
			objs := objects(t, manifest)
			for _, k := range tc.wantKinds {
				if find(objs, k, "") == nil {
					t.Errorf("no %s rendered", k)
				}
			}
			checkController(t, objs, bin)
			if tc.vals != nil {
				cs, _, _ := unstructured.NestedSlice(find(objs, "Deployment", releaseName).Object, "spec", "template", "spec", "containers")
				args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
				if !slices.Contains(args, "--sidecar-no-proxy=10.96.0.0/12,10.244.0.0/16") {
					t.Errorf("controller args %q lack sidecar.noProxy", args)
				}
			}
			checkWebhook(t, objs)
			for _, o := range objs {
				gv := o.GroupVersionKind().Group
				if slices.Contains(thirdParty, gv) {
					continue
				}
				if o.GetNamespace() == "" && namespaced(o.GetKind()) {
					o.SetNamespace(releaseNS)
				}
				if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.DryRunAll, client.FieldOwner("chart-test"), client.ForceOwnership); err != nil {
					t.Errorf("the API server refuses %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
		})
	}
}

func namespaced(kind string) bool {
	return !slices.Contains([]string{"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "Namespace"}, kind)
}

// checkController pins the Deployment: least privilege at runtime, leader
// election, and arguments the real binary accepts.
func checkController(t *testing.T, objs []*unstructured.Unstructured, bin string) {
	t.Helper()
	d := find(objs, "Deployment", releaseName)
	if d == nil {
		t.Fatal("no controller Deployment")
	}
	cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	c := cs[0].(map[string]any)
	if ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem"); !ro {
		t.Error("controller root filesystem is writable")
	}
	if nr, _, _ := unstructured.NestedBool(d.Object, "spec", "template", "spec", "securityContext", "runAsNonRoot"); !nr {
		t.Error("controller may run as root")
	}
	mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	var paths []string
	for _, m := range mounts {
		paths = append(paths, m.(map[string]any)["mountPath"].(string))
	}
	if !slices.Contains(paths, "/tmp") {
		t.Errorf("controller mounts %v: no writable /tmp on a read-only root (the kvm provider stages its seed ISO there)", paths)
	}
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	for _, want := range []string{"--leader-elect=true", "--lease-api-token-review=true", "--gateway-image=ghcr.io/proxyfleet/proxyfleet-sidecar:0.1.0"} {
		if !slices.Contains(args, want) {
			t.Errorf("controller args %q lack %s", args, want)
		}
	}
	// The real binary parses the rendered arguments and reads the files the
	// chart mounts (here from the rendered Secret and ConfigMap): a renamed
	// flag or a bad providers config would crash-loop the controller. It
	// stops at the missing kubeconfig, after every flag was validated.
	dir := t.TempDir()
	files := map[string]string{"/etc/proxyfleet/lease-api/token": "a-token\n", "/etc/proxyfleet/lease-store/password": "a-password\n"}
	if cm := find(objs, "ConfigMap", releaseName+"-providers"); cm != nil {
		files["/etc/proxyfleet/providers/providers.yaml"], _, _ = unstructured.NestedString(cm.Object, "data", "providers.yaml")
	}
	for i, a := range args {
		for path, content := range files {
			if strings.HasSuffix(a, "="+path) {
				local := filepath.Join(dir, filepath.Base(path))
				if err := os.WriteFile(local, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
				args[i] = strings.TrimSuffix(a, path) + local
			}
		}
	}
	out, _ := exec.Command(bin, append(args, "--kubeconfig", "/nonexistent/kubeconfig")...).CombinedOutput()
	if !strings.Contains(string(out), "--kubeconfig /nonexistent/kubeconfig") {
		t.Errorf("proxyfleet %s rejects the chart's arguments:\n%s", strings.Join(args, " "), out)
	}
}

func TestChartReplicasShareARedisStoreAndKeepADisruptionBudget(t *testing.T) {
	manifest, err := render(t, map[string]any{
		"controller": map[string]any{"replicas": 3},
		"leaseStore": map[string]any{"url": "rediss+sentinel://s1:26379,s2:26379/leases", "passwordSecret": "redis-password", "prefix": "eu",
			"tlsSecret": "redis-tls", "tlsClientCert": true, "shards": 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, manifest)
	d := find(objs, "Deployment", releaseName)
	if n, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas"); n != 3 {
		t.Fatalf("replicas %d, want 3", n)
	}
	cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
	for _, want := range []string{"--lease-store=rediss+sentinel://s1:26379,s2:26379/leases", "--lease-store-prefix=eu", "--lease-store-shards=3",
		"--lease-store-password-file=/etc/proxyfleet/lease-store/password",
		"--lease-store-ca-file=/etc/proxyfleet/lease-store-tls/ca.crt", "--lease-store-cert-file=/etc/proxyfleet/lease-store-tls/tls.crt",
		"--lease-store-key-file=/etc/proxyfleet/lease-store-tls/tls.key"} {
		if !slices.Contains(args, want) {
			t.Errorf("controller args %q lack %s", args, want)
		}
	}
	vols, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
	if !strings.Contains(strings.ReplaceAll(fmt.Sprint(vols), " ", ""), "secretName:redis-tls") {
		t.Errorf("no volume of the Secret redis-tls in %v", vols)
	}
	pdb := find(objs, "PodDisruptionBudget", releaseName)
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget for 3 replicas")
	}
	if n, _, _ := unstructured.NestedInt64(pdb.Object, "spec", "minAvailable"); n != 1 {
		t.Errorf("minAvailable %d, want 1", n)
	}
	one, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if find(objects(t, one), "PodDisruptionBudget", "") != nil {
		t.Error("a PodDisruptionBudget for a single replica would block every node drain")
	}
}

// TestChartControllerUpdateStrategyFollowsTheStore pins the upgrade
// settings: with the memory store the old controller stops before the new
// one starts (never two stores of leases), on a shared store a new replica
// is up before an old one goes.
func TestChartControllerUpdateStrategyFollowsTheStore(t *testing.T) {
	for _, tc := range []struct {
		name        string
		vals        map[string]any
		typ         string
		unavailable any
	}{
		{"memory store", nil, "Recreate", nil},
		{"shared store", map[string]any{
			"controller": map[string]any{"replicas": 2},
			"leaseStore": map[string]any{"url": "redis://redis:6379/0"},
		}, "RollingUpdate", int64(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			manifest, err := render(t, tc.vals)
			if err != nil {
				t.Fatal(err)
			}
			d := find(objects(t, manifest), "Deployment", releaseName)
			typ, _, _ := unstructured.NestedString(d.Object, "spec", "strategy", "type")
			u, found, _ := unstructured.NestedFieldNoCopy(d.Object, "spec", "strategy", "rollingUpdate", "maxUnavailable")
			if typ != tc.typ || (tc.unavailable == nil) == found || (found && u != tc.unavailable) {
				t.Fatalf("strategy %s maxUnavailable %v, want %s %v", typ, u, tc.typ, tc.unavailable)
			}
		})
	}
}

// checkWebhook pins the selectors that keep failurePolicy Fail to opted-in
// pods outside the release namespace.
func checkWebhook(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	w := find(objs, "MutatingWebhookConfiguration", "")
	if w == nil {
		t.Fatal("no MutatingWebhookConfiguration")
	}
	hooks, _, _ := unstructured.NestedSlice(w.Object, "webhooks")
	if len(hooks) != 2 {
		t.Fatalf("%d webhooks, want the pod-label and the namespace-label one", len(hooks))
	}
	for _, h := range hooks {
		m := h.(map[string]any)
		ns, _, _ := unstructured.NestedSlice(m, "namespaceSelector", "matchExpressions")
		if len(ns) == 0 || !strings.Contains(strings.Join(toStrings(ns), " "), releaseNS) {
			t.Errorf("webhook %v does not skip the release namespace: %v", m["name"], ns)
		}
		if path, _, _ := unstructured.NestedString(m, "clientConfig", "service", "path"); path != "/inject" {
			t.Errorf("webhook %v path %q, want /inject", m["name"], path)
		}
	}
}

func toStrings(xs []any) []string {
	var out []string
	for _, x := range xs {
		m, _ := x.(map[string]any)
		vals, _ := m["values"].([]any)
		for _, v := range vals {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// readmeDeployBlocks are the YAML blocks of the README's "Deploy on a cluster".
func readmeDeployBlocks(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	start := strings.Index(text, "\n## Deploy on a cluster\n")
	if start < 0 {
		t.Fatal("README.md has no ## Deploy on a cluster section")
	}
	section := text[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	if !strings.Contains(section, "helm install proxyfleet charts/proxyfleet") || !strings.Contains(section, "kubectl -n proxyfleet-system scale pxp/eu") {
		t.Fatal("the README's deploy section lost its helm install or kubectl scale command")
	}
	var docs []string
	for _, part := range strings.Split(section, "```yaml\n")[1:] {
		docs = append(docs, part[:strings.Index(part, "```")])
	}
	return strings.Join(docs, "---\n")
}

// TestREADMEDeployExamplesAreAcceptedByTheAPIServer: the crawler
// Deployment (labelled for injection), its ServiceAccount and RoleBinding
// to proxyfleet-lease-user, and the ProxyPool and the ProxyGrant sharing it
// with the crawler's namespace the README shows are valid
// objects for a real API server with the chart's CRDs.
func TestREADMEDeployExamplesAreAcceptedByTheAPIServer(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	for _, ns := range []string{releaseNS, "crawl"} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	objs := objects(t, readmeDeployBlocks(t))
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind())
		if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.DryRunAll, client.FieldOwner("readme-test"), client.ForceOwnership); err != nil {
			t.Errorf("the API server refuses the README's %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	slices.Sort(kinds)
	if want := []string{"Deployment", "ProxyGrant", "ProxyPool", "RoleBinding", "ServiceAccount"}; !slices.Equal(kinds, want) {
		t.Fatalf("README deploy objects %v, want %v", kinds, want)
	}
	d := find(objs, "Deployment", "crawler")
	if v, _, _ := unstructured.NestedString(d.Object, "spec", "template", "metadata", "labels", "proxyfleet.io/inject"); v != "true" {
		t.Fatal("the README's crawler is not labelled for injection")
	}
}

// controllerArgs are the rendered controller container's arguments.
func controllerArgs(t *testing.T, vals map[string]any) []string {
	t.Helper()
	manifest, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	d := find(objects(t, manifest), "Deployment", releaseName)
	if d == nil {
		t.Fatal("no controller Deployment")
	}
	cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
	return args
}

// A Proxy without healthCheck.url is probed at controller.defaultProbeURL
// when it is set; unset, the flag is left out (the controller's default:
// no probe, never offered).
func TestChartPassesTheDefaultProbeURL(t *testing.T) {
	const u = "http://probe.example/generate_204"
	if args := controllerArgs(t, map[string]any{"controller": map[string]any{"defaultProbeURL": u}}); !slices.Contains(args, "--default-probe-url="+u) {
		t.Errorf("args %q lack --default-probe-url=%s", args, u)
	}
	for _, a := range controllerArgs(t, nil) {
		if strings.HasPrefix(a, "--default-probe-url") {
			t.Errorf("the defaults pass %s", a)
		}
	}
}

// clusterTargets.cidrs reaches the controller (which gives it to the
// sidecars it injects and to the kubernetes provider's Squids) and the
// shared gateway as --cluster-target-cidrs; unset, neither gets the flag.
func TestChartPassesTheClusterTargets(t *testing.T) {
	const want = "--cluster-target-cidrs=10.244.0.0/16,10.96.0.0/12"
	vals := map[string]any{"clusterTargets": map[string]any{"cidrs": []any{"10.244.0.0/16", "10.96.0.0/12"}}, "sharedGateway": map[string]any{"enabled": true}}
	if args := controllerArgs(t, vals); !slices.Contains(args, want) {
		t.Errorf("controller args %q lack %s", args, want)
	}
	gatewayArgs := func(vals map[string]any) []string {
		manifest, err := render(t, vals)
		if err != nil {
			t.Fatal(err)
		}
		d := find(objects(t, manifest), "Deployment", releaseName+"-gateway")
		if d == nil {
			t.Fatal("no shared gateway Deployment")
		}
		cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
		return args
	}
	if args := gatewayArgs(vals); !slices.Contains(args, want) {
		t.Errorf("shared gateway args %q lack %s", args, want)
	}
	off := map[string]any{"sharedGateway": map[string]any{"enabled": true}}
	for _, a := range append(controllerArgs(t, off), gatewayArgs(off)...) {
		if strings.HasPrefix(a, "--cluster-target-cidrs") {
			t.Errorf("the defaults pass %s", a)
		}
	}
}

// The shared gateway's --auth-token-file is the Secret's "clients": the
// client "shared" with sharedGateway.clientToken (the Secret's "tokens",
// as before token clients) and every member, then sharedGateway.clients;
// the gateway's own parser reads it.
func TestChartWritesTheSharedGatewaysTokenClients(t *testing.T) {
	vals := map[string]any{"sharedGateway": map[string]any{"enabled": true, "clientToken": "tok-shared",
		"clients": "team-a tok-a pool=fleet/eu\nteam-b tok-b select=region=us\n"}}
	manifest, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, manifest)
	sec := find(objs, "Secret", releaseName+"-gateway-clients")
	d := find(objs, "Deployment", releaseName+"-gateway")
	if sec == nil || d == nil {
		t.Fatal("no shared gateway Secret or Deployment")
	}
	data, _, _ := unstructured.NestedStringMap(sec.Object, "data")
	raw, err := base64.StdEncoding.DecodeString(data["clients"])
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := base64.StdEncoding.DecodeString(data["tokens"]); string(tok) != "tok-shared" {
		t.Errorf("tokens = %q, want the shared client's token alone", tok)
	}
	cs, err := clients.Parse(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the chart's clients file is refused: %v\n%s", err, raw)
	}
	var got []string
	for _, c := range cs {
		got = append(got, c.Name+" "+c.Token+" "+c.Allowance())
	}
	want := []string{"shared tok-shared all", "team-a tok-a pool=fleet/eu", "team-b tok-b select=region=us"}
	if !slices.Equal(got, want) {
		t.Errorf("clients %q, want %q", got, want)
	}
	cs2, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(cs2[0].(map[string]any), "args")
	if !slices.Contains(args, "--auth-token-file=/etc/proxyfleet/clients/clients") {
		t.Errorf("gateway args %q do not read the clients key", args)
	}
}

// leaseAPI.tenancy reaches the controller as --lease-api-tenancy (namespaced
// unless told cluster-wide, the migration setting), and the controller may
// read ProxyGrants and write their status, cluster-wide or, with
// controller.proxyNamespace, in that namespace.
func TestChartPassesTheTenancyAndLetsTheControllerReadGrants(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"the default is namespaced", nil, "--lease-api-tenancy=namespaced"},
		{"cluster-wide for a migration", map[string]any{"leaseAPI": map[string]any{"tenancy": "cluster-wide"}}, "--lease-api-tenancy=cluster-wide"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if args := controllerArgs(t, tc.vals); !slices.Contains(args, tc.want) {
				t.Errorf("controller args %q lack %s", args, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name string
		vals map[string]any
		kind string
	}{
		{"watching every namespace", nil, "ClusterRole"},
		{"with controller.proxyNamespace", map[string]any{"controller": map[string]any{"proxyNamespace": "fleet"}}, "Role"},
	} {
		t.Run("RBAC "+tc.name, func(t *testing.T) {
			manifest, err := render(t, tc.vals)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string][]string{"proxygrants": {"get", "list", "watch"}, "proxygrants/status": {"patch"}}
			for _, o := range objects(t, manifest) {
				if o.GetKind() != tc.kind {
					continue
				}
				rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
				for _, r := range rules {
					rm := r.(map[string]any)
					res, _, _ := unstructured.NestedStringSlice(rm, "resources")
					verbs, _, _ := unstructured.NestedStringSlice(rm, "verbs")
					for _, rs := range res {
						if need, ok := want[rs]; ok && !slices.ContainsFunc(need, func(v string) bool { return !slices.Contains(verbs, v) }) {
							delete(want, rs)
						}
					}
				}
			}
			if len(want) > 0 {
				t.Errorf("no %s grants the controller %v", tc.kind, want)
			}
		})
	}
}
