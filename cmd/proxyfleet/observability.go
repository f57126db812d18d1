package main

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/tracing"
)

// tracingShutdownGrace bounds the flush of buffered spans at exit.
const tracingShutdownGrace = 5 * time.Second

// setupTracing sets tracing up from the OTEL_* environment for service
// (tracing.Setup; spans of the console exporter go to stderr) and logs
// which exporters it uses. Its stop flushes the spans still buffered.
func setupTracing(ctx context.Context, service string, stderr io.Writer, log *slog.Logger) (tr *tracing.Tracing, stop func(), err error) {
	tr, err = tracing.Setup(ctx, tracing.Options{Service: service, Console: stderr, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	if !tr.Enabled() {
		return tr, func() {}, nil
	}
	log.Info("tracing on", "exporters", tr.Exporters())
	return tr, func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownGrace)
		defer cancel()
		if err := tr.Shutdown(ctx); err != nil {
			log.Warn("spans were lost at shutdown", "err", err)
		}
	}, nil
}
