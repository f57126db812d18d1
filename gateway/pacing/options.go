package pacing

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/gateway/sites"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// DefaultMaxWait is how long a request waits for its slot when
// Options.MaxWait is zero.
const DefaultMaxWait = 30 * time.Second

// Options configure pacing (gateway.Options.Pacing): how fast the
// gateway sends requests to a site, so that the site has no reason to
// ban. The zero value paces nothing.
type Options struct {
	// Default is every site's pace where no entry of Sites names it
	// (--site-min-interval, --site-max-concurrency).
	Default rotation.PaceLimits
	// Sites replace Default for the sites they name (--site-pace).
	Sites SitePaces
	// Auto is the automatic slow-down (--pacing auto): a site's first
	// rate_limited or banned answer cuts its pace for the whole pool,
	// answers raise it again slowly (rotation.LearntPace).
	Auto bool
	// MaxWait bounds a request's wait for its slot (default
	// DefaultMaxWait); past it the answer is 503 paced.
	MaxWait time.Duration
	// Rule is what a site's first ban teaches the pool under Auto
	// (--pacing-window, --pacing-increase-steps, --pacing-memory); the
	// zero value is the fixed first cut (rotation.PaceFirstCut, no pause,
	// forgotten after rotation.PaceQuiet) and logs no evidence.
	Rule rotation.PaceRule
}

// SitePaces are explicit paces per site (--site-pace PATTERN
// [min-interval=DURATION] [max-concurrency=N]).
type SitePaces struct {
	t sites.Values[rotation.PaceLimits]
}

// ParseSitePaces reads entries of the form `PATTERN key=value ...`, the
// pattern a host, *.domain or IP, the keys min-interval (a duration, 0
// for none) and max-concurrency (an integer, 0 for unlimited). An entry
// replaces the default pace for its sites in what it names; what it does
// not name stays the default.
func ParseSitePaces(entries []string, def rotation.PaceLimits) (SitePaces, error) {
	var sp SitePaces
	for _, e := range entries {
		fields := strings.Fields(e)
		if len(fields) < 2 {
			return SitePaces{}, errors.New("site pace " + echo.Quote(e) + ": want PATTERN min-interval=DURATION max-concurrency=N (either or both), e.g. \"*.example.com min-interval=2s max-concurrency=4\"")
		}
		lim := def
		seen := map[string]bool{}
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			if !ok || seen[k] {
				return SitePaces{}, errors.New("site pace " + echo.Quote(e) + ": " + echo.Quote(f) + " is not a key=value given once (min-interval=DURATION, max-concurrency=N)")
			}
			seen[k] = true
			switch k {
			case "min-interval":
				d, err := time.ParseDuration(v)
				if err != nil || d < 0 {
					return SitePaces{}, errors.New("site pace " + echo.Quote(e) + ": min-interval " + echo.Quote(v) + " is not a duration of 0 or more")
				}
				lim.MinInterval = d
			case "max-concurrency":
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 {
					return SitePaces{}, errors.New("site pace " + echo.Quote(e) + ": max-concurrency " + echo.Quote(v) + " is not an integer of 0 or more")
				}
				lim.MaxConcurrency = n
			default:
				return SitePaces{}, errors.New("site pace " + echo.Quote(e) + ": unknown key " + echo.Quote(k) + " (want min-interval or max-concurrency)")
			}
		}
		if err := sp.t.Add(e, fields[0], lim); err != nil {
			return SitePaces{}, err
		}
	}
	return sp, nil
}

// For returns the pace set for host, and whether one is.
func (sp SitePaces) For(host string) (rotation.PaceLimits, bool) { return sp.t.For(host) }
