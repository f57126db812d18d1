package gateway

import "github.com/proxyfleet/proxyfleet/gateway/sites"

// sitePatterns is sites.Values under the names the pacing stage
// (pace.go) reads its per-site limits by; it goes when pacing moves to a
// package of its own.
type sitePatterns[T any] struct{ sites.Values[T] }

func (sp *sitePatterns[T]) add(entry, pat string, v T) error { return sp.Add(entry, pat, v) }
func (sp *sitePatterns[T]) empty() bool                      { return sp.Empty() }
