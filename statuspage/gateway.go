package statuspage

import (
	"context"
	"net/http"

	"k8s.io/utils/clock"
)

// PoolReader is what the gateway page reads its pool through;
// the gateway run's server (gateway/daemon) implements it.
type PoolReader interface {
	PoolStatus(ctx context.Context) PoolSnapshot
}

// GatewayOptions configures GatewayHandler.
type GatewayOptions struct {
	Pool PoolReader
	// PoolAPI is --lease-api ("" for an own pool).
	PoolAPI string
	// Requests is the timeline the gateway's metrics recorder feeds.
	Requests *Timeline
	// Next serves every other path (the metrics handler).
	Next http.Handler
	// Paces lists the paced sites (nil: none shown).
	Paces func() []SitePace
	// Clock is the time source (the real clock when nil).
	Clock clock.PassiveClock
}

// GatewayHandler serves the gateway's page and JSON (see Handler).
func GatewayHandler(o GatewayOptions) http.Handler {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return Handler(HandlerOptions{
		Title: "proxyfleet gateway",
		Next:  o.Next,
		View: func(ctx context.Context) any {
			var paces []SitePace
			if o.Paces != nil {
				paces = o.Paces()
			}
			return Gateway(GatewayInput{Pool: o.Pool.PoolStatus(ctx), PoolAPI: o.PoolAPI, Requests: o.Requests.Chart(), Paces: paces}, o.Clock.Now())
		},
	})
}
