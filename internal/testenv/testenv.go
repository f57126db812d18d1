// Package testenv starts a real kube-apiserver and etcd (controller-runtime's
// envtest) with proxyfleet's CRDs installed, for tests that must talk to a real
// API server: CEL validation, defaulting, the reconcilers, the kubernetes
// provider.
//
// The binaries come from bin/k8s/ at the repository root, built from the Go
// module proxy by `make envtest-bins` (which `make test` runs), or from the
// directory in KUBEBUILDER_ASSETS. When they are missing the test fails with
// the command to run; it never skips.
//
// One Env per test costs about 4 seconds. To share one per package, start it in
// TestMain with Run and give each test its own namespace:
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) { testenv.Run(m, &env) }
//
//	func TestSomething(t *testing.T) {
//		ns := env.Namespace(t)
//		...env.Client.Create(ctx, obj) with obj.Namespace = ns...
//	}
//
// A test that needs a control plane of its own calls Start(t) instead.
//
// It imports api/v1alpha1 and envtest only; test code alone imports it.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

const (
	// modulePath identifies the repository root's go.mod.
	modulePath = "github.com/proxyfleet/proxyfleet"
	// binDir is where `make envtest-bins` puts the binaries, relative to the root.
	binDir = "bin/k8s"
	// crdDir is the single home of the generated CRDs, relative to the root.
	crdDir = "charts/proxyfleet/crds"
	// assetsEnv overrides the binary directory, as in envtest itself.
	assetsEnv = "KUBEBUILDER_ASSETS"
	// startTimeout is generous: CI is a busy 2-core machine.
	startTimeout = 90 * time.Second
	stopTimeout  = 30 * time.Second
)

// Env is a running control plane with the CRDs installed.
type Env struct {
	// Config reaches the API server as cluster admin.
	Config *rest.Config
	// Client is a direct (uncached) client over Config with Scheme.
	Client client.Client
	// Scheme holds the client-go built-in types and proxyfleet.io/v1alpha1.
	Scheme *runtime.Scheme
	// KubeConfig is a kubeconfig for Config, for processes started by tests.
	KubeConfig []byte

	env *envtest.Environment
}

// NewScheme returns a fresh scheme with the built-in Kubernetes types and
// proxyfleet.io/v1alpha1, as the controller uses.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add client-go types to scheme: %w", err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add proxyfleet.io/v1alpha1 to scheme: %w", err)
	}
	return s, nil
}

// Start starts a control plane for one test and stops it when the test ends.
// It fails the test (never skips) when the binaries are missing.
func Start(t testing.TB) *Env {
	t.Helper()
	e, err := New()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("testenv: stop: %v", err)
		}
	})
	return e
}

// Run starts one control plane for a whole test binary, runs the tests and
// stops it, then exits; call it from TestMain with the package's *Env
// variable. A control plane that cannot start fails the run loudly.
func Run(m *testing.M, env **Env) {
	e, err := New()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: testenv: %v\n", err)
		os.Exit(1)
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stop: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// New starts a control plane with proxyfleet's CRDs installed. The caller
// must Stop it. Most tests want Start or Run instead.
func New() (*Env, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	assets, err := BinaryDir(root)
	if err != nil {
		return nil, err
	}
	s, err := NewScheme()
	if err != nil {
		return nil, err
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        []string{filepath.Join(root, crdDir)},
		ErrorIfCRDPathMissing:    true,
		Scheme:                   s,
		ControlPlaneStartTimeout: startTimeout,
		ControlPlaneStopTimeout:  stopTimeout,
	}
	cfg, err := te.Start()
	if err != nil {
		// Start may leave etcd running when the API server fails.
		stopErr := te.Stop()
		return nil, errors.Join(fmt.Errorf("start envtest (binaries in %s): %w", assets, err), stopErr)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("client for envtest: %w", err), te.Stop())
	}
	return &Env{Config: cfg, Client: c, Scheme: s, KubeConfig: te.KubeConfig, env: te}, nil
}

// Stop shuts the API server and etcd down and removes their data.
func (e *Env) Stop() error {
	return e.env.Stop()
}

// Namespace creates a fresh namespace for t and returns its name, so tests
// sharing one Env do not see each other's objects. envtest runs no namespace
// controller, so the namespace is not deleted afterwards; the Env is.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}
	if err := e.Client.Create(ctx, ns); err != nil {
		t.Fatalf("testenv: create namespace: %v", err)
	}
	return ns.Name
}

// WriteKubeconfig writes KubeConfig to a file in t's temp dir and returns its
// path, for processes (the proxyfleet binary) that a test starts.
func (e *Env) WriteKubeconfig(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, e.KubeConfig, 0o600); err != nil {
		t.Fatalf("testenv: write kubeconfig: %v", err)
	}
	return p
}

// RepoRoot walks up from the working directory to the go.mod of module
// github.com/proxyfleet/proxyfleet (go test runs in the package directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && isRootModule(data) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s above the working directory", modulePath)
		}
		dir = parent
	}
}

func isRootModule(gomod []byte) bool {
	for _, line := range strings.Split(string(gomod), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "module" {
			return f[1] == modulePath
		}
	}
	return false
}

// BinaryDir returns the directory holding kube-apiserver and etcd:
// KUBEBUILDER_ASSETS when set, else bin/k8s under root. It is an error, with
// the command that fixes it, when either binary is missing.
func BinaryDir(root string) (string, error) {
	dir := os.Getenv(assetsEnv)
	if dir == "" {
		dir = filepath.Join(root, binDir)
	}
	var missing []string
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		if os.Getenv(assetsEnv) != "" {
			return "", fmt.Errorf("envtest binaries missing in %s=%s (%s): unset it or run make envtest-bins (make test does it)",
				assetsEnv, dir, strings.Join(missing, ", "))
		}
		return "", fmt.Errorf("envtest binaries missing in %s (%s): run make envtest-bins (make test does it)",
			binDir, strings.Join(missing, ", "))
	}
	return dir, nil
}
