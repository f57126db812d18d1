package digitalocean

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/digitalocean/godo"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
)

// userAgent names proxyfleet in DigitalOcean's request logs.
const userAgent = "proxyfleet"

// newClient is the godo client of cfg over base: the endpoint, the token
// read from its file on every request (tokenTransport), and no retries:
// godo retries only when given a RetryConfig, which it is never given,
// because the reconciler already retries with backoff, and a call held in
// an SDK's retry loop would hold a reconcile worker and hide throttling
// from the reconciler.
func newClient(cfg Config, base http.RoundTripper) (*godo.Client, error) {
	hc := &http.Client{Transport: tokenTransport{file: cfg.TokenFile, noAuth: cfg.NoAuth, base: base}}
	opts := []godo.ClientOpt{godo.SetUserAgent(userAgent)}
	if cfg.Endpoint != "" {
		opts = append(opts, godo.SetBaseURL(strings.TrimSuffix(cfg.Endpoint, "/")+"/"))
	}
	return godo.New(hc, opts...)
}

// tracedTransport is the provider's long-lived transport: its requests
// are spans of the provider call that made them, as the gcp and aws
// providers' are.
func tracedTransport() http.RoundTripper {
	return otelhttp.NewTransport(http.DefaultTransport.(*http.Transport).Clone())
}

// tokenTransport sets the API token from its file on every request: the
// kubelet rewrites a mounted Secret in place when it changes, so a rotated
// token takes effect on the next call without a restart. Its errors name
// the file, never its content.
type tokenTransport struct {
	file   string
	noAuth bool
	base   http.RoundTripper
}

// RoundTrip sends r with the token, or with none for noAuth.
func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.noAuth {
		return t.base.RoundTrip(r)
	}
	token, err := readToken(t.file)
	if err != nil {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, err
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+token)
	return t.base.RoundTrip(r)
}

// errTokenFile marks a token file that cannot be used; the request was
// never sent. classify calls a missing file Transient (a Secret may be
// mounted later) and an empty or unreadable one Permanent.
var errTokenFile = errors.New("digitalocean token file")

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errTokenFile, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("%w %s is empty", errTokenFile, path)
	}
	if strings.ContainsAny(v, "\r\n\t ") {
		return "", fmt.Errorf("%w %s holds more than one word", errTokenFile, path)
	}
	return v, nil
}
