package providers_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/providertest"
)

// builtProvider is what the registry test's constructors build: the one
// provider fake, with the entry the constructor was given.
type builtProvider struct {
	*providertest.Provider
	entry providers.Entry
}

func entryProvider(e providers.Entry) *builtProvider {
	return &builtProvider{Provider: providertest.New(), entry: e}
}

func TestRegistryBuild(t *testing.T) {
	cfg, err := providers.ParseConfig([]byte(providers.DocsExample), providers.TestTypes)
	if err != nil {
		t.Fatal(err)
	}
	ctors := map[string]providers.Constructor{
		"kubernetes": func(e providers.Entry) (providers.Provider, error) { return entryProvider(e), nil },
	}
	reg := providers.NewRegistry(ctors)
	ctors["gcp"] = func(e providers.Entry) (providers.Provider, error) { return entryProvider(e), nil } // must not leak into reg

	t.Run("builds the types it has and names the one it lacks", func(t *testing.T) {
		got, err := reg.Build(cfg)
		if err == nil || !strings.Contains(err.Error(), "providers[1] (gcp-eu): provider type gcp is not built into this binary yet") {
			t.Fatalf("error = %v", err)
		}
		p, ok := got["in-cluster"].(*builtProvider)
		if !ok || len(got) != 1 {
			t.Fatalf("built %v, want only in-cluster", got)
		}
		if b, err := providers.DecodeStub(p.entry); err != nil || b.Namespace != "proxyfleet-egress" {
			t.Fatalf("constructor got entry %+v, whose block reads as %+v, %v", p.entry, b, err)
		}
	})

	t.Run("builds everything when every type has a constructor", func(t *testing.T) {
		got, err := providers.NewRegistry(ctors).Build(cfg)
		if err != nil || len(got) != 2 || got["gcp-eu"] == nil {
			t.Fatalf("Build = %v, %v", got, err)
		}
	})

	t.Run("a failing constructor is named with its entry", func(t *testing.T) {
		boom := map[string]providers.Constructor{
			"kubernetes": func(providers.Entry) (providers.Provider, error) { return nil, errors.New("no client") },
			"gcp":        func(e providers.Entry) (providers.Provider, error) { return entryProvider(e), nil },
		}
		got, err := providers.NewRegistry(boom).Build(cfg)
		if err == nil || !strings.Contains(err.Error(), "providers[0] (in-cluster): no client") {
			t.Fatalf("error = %v", err)
		}
		if len(got) != 1 || got["gcp-eu"] == nil {
			t.Fatalf("built %v, want gcp-eu only", got)
		}
	})

	t.Run("a constructor returning nil is an error, not a nil provider", func(t *testing.T) {
		nilCtor := map[string]providers.Constructor{"kubernetes": func(providers.Entry) (providers.Provider, error) { return nil, nil }}
		got, err := providers.NewRegistry(nilCtor).Build(providers.Config{Providers: cfg.Providers[:1]})
		if err == nil || len(got) != 0 {
			t.Fatalf("Build = %v, %v", got, err)
		}
	})

	t.Run("a config whose names are not unique labels builds nothing", func(t *testing.T) {
		bad := providers.Config{Providers: []providers.Entry{{Name: "X_1", Type: "kubernetes"}, cfg.Providers[0], cfg.Providers[0]}}
		got, err := providers.NewRegistry(ctors).Build(bad)
		if err == nil || !strings.Contains(err.Error(), `providers[0] (X_1): name "X_1" is not a DNS-1123 label`) ||
			!strings.Contains(err.Error(), `providers[2] (in-cluster): name "in-cluster" is already used by providers[1]`) {
			t.Fatalf("error = %v", err)
		}
		if got == nil || len(got) != 0 {
			t.Fatalf("built %v from an invalid config, want an empty map", got)
		}
	})
}
