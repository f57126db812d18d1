package tracing

import (
	"context"
	"io"
	"log/slog"
	"time"
)

// shutdownGrace bounds the flush of buffered spans at exit.
const shutdownGrace = 5 * time.Second

// Start is Setup as a command runs it: from the OTEL_* environment for
// service, spans of the console exporter going to console (the process's
// stderr), with the exporters it uses logged to log. Its stop flushes the
// spans still buffered, for at most five seconds, and logs any it lost.
func Start(ctx context.Context, service string, console io.Writer, log *slog.Logger) (tr *Tracing, stop func(), err error) {
	tr, err = Setup(ctx, Options{Service: service, Console: console, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	if !tr.Enabled() {
		return tr, func() {}, nil
	}
	log.Info("tracing on", "exporters", tr.Exporters())
	return tr, func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := tr.Shutdown(ctx); err != nil {
			log.Warn("spans were lost at shutdown", "err", err)
		}
	}, nil
}
