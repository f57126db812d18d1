//go:build !sidecar

package main

import (
	"bytes"
	"encoding/json"
	"log"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
)

// TestControllerLoggerTakesOverEveryLogger: after controllerLogger, klog
// (within its verbosity gate), controller-runtime, slog's default and the
// standard library's log all write JSON records to the one writer.
func TestControllerLoggerTakesOverEveryLogger(t *testing.T) {
	prevSlog, prevFlags, prevOut := slog.Default(), log.Flags(), log.Writer()
	t.Cleanup(func() {
		slog.SetDefault(prevSlog) // leaves log's output alone: restored below
		log.SetOutput(prevOut)
		log.SetFlags(prevFlags)
		klog.ClearLogger()
	})
	var buf bytes.Buffer
	controllerLogger(&buf, slog.LevelDebug, true)

	klog.Info("from klog")
	klog.V(2).Info("from klog at V(2): above klog's verbosity, dropped")
	ctrl.Log.WithName("ctrl").Info("from controller-runtime")
	slog.Info("from slog")
	log.Print("from the standard library")
	klog.Flush()

	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON: %q (%v)", line, err)
		}
		if _, err := time.Parse(time.RFC3339, m["time"].(string)); err != nil {
			t.Errorf("time %v is not RFC 3339", m["time"])
		}
		msgs = append(msgs, m["msg"].(string))
	}
	want := []string{"from klog", "from controller-runtime", "from slog", "from the standard library"}
	if strings.Join(msgs, "|") != strings.Join(want, "|") {
		t.Fatalf("records %q, want %q", msgs, want)
	}
}
