package providers

import (
	"errors"
	"fmt"
)

// Constructor builds a provider from its config entry, reading the entry's
// block with the type's own config reader. Constructors are closures made at
// the composition root (cmd), where the clients they need (a Kubernetes
// client, cloud credentials) are at hand.
type Constructor func(e Entry) (Provider, error)

// Registry builds providers from a Config with the constructors it was given.
// It holds no package-level state: the binary decides which types it builds.
type Registry struct {
	constructors map[string]Constructor
}

// NewRegistry returns a registry that builds each type with constructors[type].
// A type the config file knows but that has no constructor here is rejected
// by Build with a clear error.
func NewRegistry(constructors map[string]Constructor) *Registry {
	c := make(map[string]Constructor, len(constructors))
	for k, v := range constructors {
		c[k] = v
	}
	return &Registry{constructors: c}
}

// Build builds every entry of cfg, keyed by entry name, each constructor
// reading its entry's block. It returns the providers it could build together
// with an error naming every entry it could not; entries without unique
// DNS-1123 names build nothing at all. The blocks are checked when the file
// is read (ParseConfig, with the types' Decoders), so a constructor's
// refusal here is about what only building can find. Callers that want all
// or nothing treat a non-nil error as fatal; the map is never nil.
func (r *Registry) Build(cfg Config) (map[string]Provider, error) {
	out := map[string]Provider{}
	var errs []error
	for i, problems := range checkNames(cfg.Providers) {
		for _, p := range problems {
			errs = append(errs, fmt.Errorf("%s: %w", entryLabel(i, cfg.Providers[i].Name), p))
		}
	}
	if len(errs) > 0 {
		return out, errors.Join(errs...)
	}
	for i, e := range cfg.Providers {
		label := entryLabel(i, e.Name)
		ctor, ok := r.constructors[e.Type]
		if !ok || ctor == nil {
			errs = append(errs, fmt.Errorf("%s: provider type %s is not built into this binary yet", label, e.Type))
			continue
		}
		p, err := ctor(e)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", label, err))
			continue
		}
		if p == nil {
			errs = append(errs, fmt.Errorf("%s: the %s constructor returned no provider", label, e.Type))
			continue
		}
		out[e.Name] = p
	}
	return out, errors.Join(errs...)
}
