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
type SiteDurations struct{ t sitePatterns[time.Duration] }

// sitePatterns is a value per host pattern (ParseHostPatterns' forms): an
// exact host or IP, or *.domain; the most specific pattern wins.
type sitePatterns[T any] struct {
	exact    map[string]T
	suffixes []siteSuffix[T] // longest first
}

type siteSuffix[T any] struct {
	suffix string // ".example.com" for "*.example.com"
	v      T
}

// add sets v for pattern pat; entry names the whole entry for errors.
func (sp *sitePatterns[T]) add(entry, pat string, v T) error {
	key, wild, err := parseHostPattern(pat)
	if err != nil {
		return err
	}
	if sp.exact == nil {
		sp.exact = map[string]T{}
	}
	if sp.has(key, wild) {
		return errors.New("site entry " + echo.Quote(entry) + ": " + echo.Quote(strings.TrimSpace(pat)) + " is given twice")
	}
	if !wild {
		sp.exact[key] = v
		return nil
	}
	sp.suffixes = append(sp.suffixes, siteSuffix[T]{suffix: key, v: v})
	// The most specific pattern wins: *.api.example.com before *.example.com.
	for j := len(sp.suffixes) - 1; j > 0 && len(sp.suffixes[j].suffix) > len(sp.suffixes[j-1].suffix); j-- {
		sp.suffixes[j], sp.suffixes[j-1] = sp.suffixes[j-1], sp.suffixes[j]
	}
	return nil
}

// has reports whether the pattern key (wild: a *.domain) is set.
func (sp *sitePatterns[T]) has(key string, wild bool) bool {
	if !wild {
		_, ok := sp.exact[key]
		return ok
	}
	for _, s := range sp.suffixes {
		if s.suffix == key {
			return true
		}
	}
	return false
}

// empty reports whether no pattern is set.
func (sp *sitePatterns[T]) empty() bool { return len(sp.exact) == 0 && len(sp.suffixes) == 0 }

// For returns the value set for host (a host name or IP literal, no
// port), and whether one is.
func (sp *sitePatterns[T]) For(host string) (T, bool) {
	var zero T
	if sp.empty() {
		return zero, false
	}
	h := matchKey(host)
	if v, ok := sp.exact[h]; ok {
		return v, true
	}
	for _, s := range sp.suffixes {
		if strings.HasSuffix(h, s.suffix) {
			return s.v, true
		}
	}
	return zero, false
}

// ParseSiteDurations reads PATTERN=DURATION entries, PATTERN as in
// ParseHostPatterns, DURATION a positive Go duration ("40s"). A pattern
// given twice is an error, as is anything else that does not read.
func ParseSiteDurations(entries []string) (SiteDurations, error) {
	var sd SiteDurations
	for _, e := range entries {
		pat, val, ok := strings.Cut(e, "=")
		if !ok {
			return SiteDurations{}, errors.New("site entry " + echo.Quote(e) + ": want PATTERN=DURATION, e.g. slow.example.com=40s")
		}
		d, err := time.ParseDuration(strings.TrimSpace(val))
		if err != nil || d <= 0 {
			return SiteDurations{}, errors.New("site entry " + echo.Quote(e) + ": " + echo.Quote(val) + " is not a positive duration")
		}
		if err := sd.t.add(e, pat, d); err != nil {
			return SiteDurations{}, err
		}
	}
	return sd, nil
}

// For returns the duration set for host (a host name or IP literal, no
// port), and whether one is.
func (sd SiteDurations) For(host string) (time.Duration, bool) { return sd.t.For(host) }
