package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
)

func TestRepoRootFindsTheRootModule(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatalf("RepoRoot: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, crdDir)); err != nil {
		t.Errorf("RepoRoot() = %s, which has no %s: %v", root, crdDir, err)
	}
}

func TestIsRootModule(t *testing.T) {
	tests := []struct {
		name  string
		gomod string
		want  bool
	}{
		{"root module", "module github.com/proxyfleet/proxyfleet\n\ngo 1.26.0\n", true},
		{"tools module is not the root", "// tools\nmodule github.com/proxyfleet/proxyfleet/e2e/tools\n", false},
		{"no module line", "go 1.26.0\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := isRootModule([]byte(tc.gomod)); got != tc.want {
				t.Errorf("isRootModule = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBinaryDir(t *testing.T) {
	writeBins := func(t *testing.T, dir string, names ...string) {
		t.Helper()
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}

	t.Run("missing binaries fail with the command that builds them", func(t *testing.T) {
		t.Setenv(assetsEnv, "")
		root := t.TempDir()
		_, err := BinaryDir(root)
		if err == nil || !strings.Contains(err.Error(), "envtest binaries missing in bin/k8s") ||
			!strings.Contains(err.Error(), "run make envtest-bins (make test does it)") {
			t.Fatalf("BinaryDir on an empty root: %v", err)
		}
	})

	t.Run("one missing binary is named", func(t *testing.T) {
		t.Setenv(assetsEnv, "")
		root := t.TempDir()
		dir := filepath.Join(root, binDir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeBins(t, dir, "kube-apiserver")
		_, err := BinaryDir(root)
		if err == nil || !strings.Contains(err.Error(), "(etcd)") {
			t.Fatalf("BinaryDir without etcd: %v", err)
		}
	})

	t.Run("bin/k8s under the root is used", func(t *testing.T) {
		t.Setenv(assetsEnv, "")
		root := t.TempDir()
		dir := filepath.Join(root, binDir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeBins(t, dir, "kube-apiserver", "etcd")
		got, err := BinaryDir(root)
		if err != nil || got != dir {
			t.Fatalf("BinaryDir = %q, %v; want %q", got, err, dir)
		}
	})

	t.Run("KUBEBUILDER_ASSETS wins over bin/k8s", func(t *testing.T) {
		assets := t.TempDir()
		writeBins(t, assets, "kube-apiserver", "etcd")
		t.Setenv(assetsEnv, assets)
		got, err := BinaryDir(t.TempDir())
		if err != nil || got != assets {
			t.Fatalf("BinaryDir = %q, %v; want %q", got, err, assets)
		}
	})

	t.Run("an empty KUBEBUILDER_ASSETS directory is an error naming it", func(t *testing.T) {
		assets := t.TempDir()
		t.Setenv(assetsEnv, assets)
		_, err := BinaryDir(t.TempDir())
		if err == nil || !strings.Contains(err.Error(), assets) {
			t.Fatalf("BinaryDir with empty assets: %v", err)
		}
	})
}

func TestStartServesTheCRDs(t *testing.T) {
	e := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ns := e.Namespace(t)
	var proxies v1alpha1.ProxyList
	if err := e.Client.List(ctx, &proxies, client.InNamespace(ns)); err != nil {
		t.Fatalf("list Proxies: %v (CRDs not installed?)", err)
	}
	if len(proxies.Items) != 0 {
		t.Errorf("fresh namespace has %d Proxies", len(proxies.Items))
	}
	var phs v1alpha1.ProviderHealthList
	if err := e.Client.List(ctx, &phs); err != nil {
		t.Fatalf("list ProviderHealths: %v", err)
	}

	// The kubeconfig a test hands to a process reaches the same server.
	cfg, err := clientcmd.BuildConfigFromFlags("", e.WriteKubeconfig(t))
	if err != nil {
		t.Fatalf("load written kubeconfig: %v", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatalf("client from kubeconfig: %v", err)
	}
	if err := c.List(ctx, &proxies, client.InNamespace(ns)); err != nil {
		t.Fatalf("list Proxies through the written kubeconfig: %v", err)
	}
}
