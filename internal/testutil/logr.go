package testutil

import (
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// LogLines records every line a logr.Logger writes, verbosity 1 included, so
// a test can assert on what a component logged (a WARNING line, a transition).
// The zero value is ready to use; it is safe for concurrent use.
type LogLines struct {
	mu    sync.Mutex
	lines []string
}

// Logger returns a logger whose every line (prefix and key/values) l records.
func (l *LogLines) Logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 1})
}

// Matching returns the recorded lines that contain every one of parts.
func (l *LogLines) Matching(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, line := range l.lines {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// String is every recorded line, one per line, for a failure message.
func (l *LogLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
