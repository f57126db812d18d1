package gateway

import (
	"errors"
	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"strings"
	"time"
)

// SiteDurations are durations set per site (--site-answer-timeout
// PATTERN=DURATION): a site known to think long before it answers (a
// report endpoint, a search that takes half a minute) gets more time than
// the default, without giving every silent member that much too.
type SiteDurations struct {
	exact    map[string]time.Duration
	suffixes []siteSuffix // longest first
}

type siteSuffix struct {
	suffix string // ".example.com" for "*.example.com"
	d      time.Duration
}

// ParseSiteDurations reads PATTERN=DURATION entries, PATTERN as in
// ParseHostPatterns, DURATION a positive Go duration ("40s"). A pattern
// given twice is an error, as is anything else that does not read.
func ParseSiteDurations(entries []string) (SiteDurations, error) {
	sd := SiteDurations{exact: map[string]time.Duration{}}
	seen := map[string]bool{}
	for _, e := range entries {
		pat, val, ok := strings.Cut(e, "=")
		if !ok {
			return SiteDurations{}, errors.New("site entry " + echo.Quote(e) + ": want PATTERN=DURATION, e.g. slow.example.com=40s")
		}
		d, err := time.ParseDuration(strings.TrimSpace(val))
		if err != nil || d <= 0 {
			return SiteDurations{}, errors.New("site entry " + echo.Quote(e) + ": " + echo.Quote(val) + " is not a positive duration")
		}
		key, wild, err := parseHostPattern(pat)
		if err != nil {
			return SiteDurations{}, err
		}
		if seen[key] {
			return SiteDurations{}, errors.New("site entry " + echo.Quote(e) + ": " + echo.Quote(strings.TrimSpace(pat)) + " is given twice")
		}
		seen[key] = true
		if wild {
			sd.suffixes = append(sd.suffixes, siteSuffix{suffix: key, d: d})
		} else {
			sd.exact[key] = d
		}
	}
	// The most specific pattern wins: *.api.example.com before *.example.com.
	for i := 1; i < len(sd.suffixes); i++ {
		for j := i; j > 0 && len(sd.suffixes[j].suffix) > len(sd.suffixes[j-1].suffix); j-- {
			sd.suffixes[j], sd.suffixes[j-1] = sd.suffixes[j-1], sd.suffixes[j]
		}
	}
	return sd, nil
}

// For returns the duration set for host (a host name or IP literal, no
// port), and whether one is.
func (sd SiteDurations) For(host string) (time.Duration, bool) {
	if len(sd.exact) == 0 && len(sd.suffixes) == 0 {
		return 0, false
	}
	h := matchKey(host)
	if d, ok := sd.exact[h]; ok {
		return d, true
	}
	for _, s := range sd.suffixes {
		if strings.HasSuffix(h, s.suffix) {
			return s.d, true
		}
	}
	return 0, false
}
