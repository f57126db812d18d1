package manager

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestLimitAPIRequestsSetsTheClientsRateLimit(t *testing.T) {
	kube := &rest.Config{}
	(&Config{KubeAPIQPS: 7, KubeAPIBurst: 9}).limitAPIRequests(kube)
	if kube.QPS != 7 || kube.Burst != 9 {
		t.Errorf("KubeAPIQPS 7, KubeAPIBurst 9 gave %v/s, burst %d", kube.QPS, kube.Burst)
	}
}

// TestControllerAPIClientHonoursRetryAfter checks, on the client the
// controller builds (its kubeconfig, its rate limit), that a 429 from the
// API server's priority and fairness is retried after the Retry-After it
// carries and not before: two refusals cost two more requests, a second
// apart, never a storm. client-go does this by itself; the test pins it.
func TestControllerAPIClientHonoursRetryAfter(t *testing.T) {
	var mu sync.Mutex
	var seen []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, time.Now())
		n := len(seen)
		mu.Unlock()
		if n <= 2 {
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429,"message":"too many requests, please try again later"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"fleet"}}`)
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: "+srv.URL+"}\n"+
		"contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := restConfig(kubeconfig, "--kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	(&Config{KubeAPIQPS: 50, KubeAPIBurst: 100}).limitAPIRequests(cfg) // the command's defaults
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "fleet", metav1.GetOptions{}); err != nil {
		t.Fatalf("GET after two 429s: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("%d requests for one GET answered 429 twice; want 3", len(seen))
	}
	for i := 1; i < len(seen); i++ {
		if gap := seen[i].Sub(seen[i-1]); gap < 900*time.Millisecond {
			t.Errorf("attempt %d came %s after a 429 with Retry-After: 1", i+1, gap)
		}
	}
}
