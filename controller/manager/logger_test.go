package manager

import (
	"encoding/json"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
)

// loggerChildEnv makes the test binary the child of
// TestProcessLoggerTakesOverEveryLogger.
const loggerChildEnv = "PROXYFLEET_TEST_LOGGER_CHILD"

// TestProcessLoggerTakesOverEveryLogger: after processLogger, klog
// (within its verbosity gate), controller-runtime, slog's default and the
// standard library's log all write JSON records to the one writer. The
// loggers are process globals that other tests' leftover goroutines read,
// so it runs in a fresh copy of the test binary, as the controller does
// once at start.
func TestProcessLoggerTakesOverEveryLogger(t *testing.T) {
	if os.Getenv(loggerChildEnv) == "1" {
		processLogger(os.Stdout, slog.LevelDebug, true)
		klog.Info("from klog")
		klog.V(2).Info("from klog at V(2): above klog's verbosity, dropped")
		ctrl.Log.WithName("ctrl").Info("from controller-runtime")
		slog.Info("from slog")
		log.Print("from the standard library")
		klog.Flush()
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestProcessLoggerTakesOverEveryLogger$")
	cmd.Env = append(os.Environ(), loggerChildEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON: %q (%v)", line, err)
		}
		if ts, _ := m["time"].(string); ts == "" {
			t.Errorf("no time: %q", line)
		} else if _, err := time.Parse(time.RFC3339, ts); err != nil {
			t.Errorf("time %q is not RFC 3339", ts)
		}
		msg, _ := m["msg"].(string)
		msgs = append(msgs, msg)
	}
	want := []string{"from klog", "from controller-runtime", "from slog", "from the standard library"}
	if strings.Join(msgs, "|") != strings.Join(want, "|") {
		t.Fatalf("records %q, want %q", msgs, want)
	}
}
