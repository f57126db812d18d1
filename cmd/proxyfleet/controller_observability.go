//go:build !sidecar

package main

import (
	"io"
	"log/slog"

	"github.com/go-logr/logr"

	"github.com/proxyfleet/proxyfleet/internal/logging"
)

// controllerLogger builds the process logger (logging.New), installs it as
// the slog and standard-library default — controller-runtime's metrics
// and probe servers log their errors there — and returns it as the
// logr.Logger controller-runtime hands to every reconcile.
func controllerLogger(w io.Writer, level slog.Level, json bool) logr.Logger {
	l := logging.New(w, level, json)
	logging.Install(l)
	return logging.Logr(l)
}
