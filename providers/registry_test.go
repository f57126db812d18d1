package providers

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// recordingProvider is a test double that answers each method with a fixed
// error and counts calls.
type recordingProvider struct {
	entry Entry
	err   error
	calls map[string]int
}

func (p *recordingProvider) count(op string) {
	if p.calls == nil {
		p.calls = map[string]int{}
	}
	p.calls[op]++
}

func (p *recordingProvider) Create(_ context.Context, req CreateRequest) (Instance, error) {
	p.count(OpCreate)
	return Instance{Name: req.Name}, p.err
}

func (p *recordingProvider) Get(_ context.Context, id string) (Instance, error) {
	p.count(OpGet)
	return Instance{ProviderID: id}, p.err
}

func (p *recordingProvider) Delete(context.Context, string) error {
	p.count(OpDelete)
	return p.err
}

func (p *recordingProvider) ListByTag(context.Context) ([]Instance, error) {
	p.count(OpList)
	return nil, p.err
}

// checkingProvider adds Checker to recordingProvider.
type checkingProvider struct {
	recordingProvider
	checks int
}

func (p *checkingProvider) Check(context.Context) []TargetStatus {
	p.checks++
	return []TargetStatus{{Target: "apiserver", Ready: true, Reason: "OK"}}
}

func TestRegistryBuild(t *testing.T) {
	cfg, err := ParseConfig([]byte(docsExample), testTypes)
	if err != nil {
		t.Fatal(err)
	}
	ctors := map[string]Constructor{
		"kubernetes": func(e Entry) (Provider, error) { return &recordingProvider{entry: e}, nil },
	}
	reg := NewRegistry(ctors)
	ctors["gcp"] = func(e Entry) (Provider, error) { return &recordingProvider{entry: e}, nil } // must not leak into reg

	t.Run("builds the types it has and names the one it lacks", func(t *testing.T) {
		got, err := reg.Build(cfg)
		if err == nil || !strings.Contains(err.Error(), "providers[1] (gcp-eu): provider type gcp is not built into this binary yet") {
			t.Fatalf("error = %v", err)
		}
		p, ok := got["in-cluster"].(*recordingProvider)
		if !ok || len(got) != 1 {
			t.Fatalf("built %v, want only in-cluster", got)
		}
		if b, err := decodeStub(p.entry); err != nil || b.Namespace != "proxyfleet-egress" {
			t.Fatalf("constructor got entry %+v, whose block reads as %+v, %v", p.entry, b, err)
		}
	})

	t.Run("builds everything when every type has a constructor", func(t *testing.T) {
		got, err := NewRegistry(ctors).Build(cfg)
		if err != nil || len(got) != 2 || got["gcp-eu"] == nil {
			t.Fatalf("Build = %v, %v", got, err)
		}
	})

	t.Run("a failing constructor is named with its entry", func(t *testing.T) {
		boom := map[string]Constructor{
			"kubernetes": func(Entry) (Provider, error) { return nil, errors.New("no client") },
			"gcp":        func(e Entry) (Provider, error) { return &recordingProvider{entry: e}, nil },
		}
		got, err := NewRegistry(boom).Build(cfg)
		if err == nil || !strings.Contains(err.Error(), "providers[0] (in-cluster): no client") {
			t.Fatalf("error = %v", err)
		}
		if len(got) != 1 || got["gcp-eu"] == nil {
			t.Fatalf("built %v, want gcp-eu only", got)
		}
	})

	t.Run("a constructor returning nil is an error, not a nil provider", func(t *testing.T) {
		nilCtor := map[string]Constructor{"kubernetes": func(Entry) (Provider, error) { return nil, nil }}
		got, err := NewRegistry(nilCtor).Build(Config{Providers: cfg.Providers[:1]})
		if err == nil || len(got) != 0 {
			t.Fatalf("Build = %v, %v", got, err)
		}
	})

	t.Run("a config whose names are not unique labels builds nothing", func(t *testing.T) {
		bad := Config{Providers: []Entry{{Name: "X_1", Type: "kubernetes"}, cfg.Providers[0], cfg.Providers[0]}}
		got, err := NewRegistry(ctors).Build(bad)
		if err == nil || !strings.Contains(err.Error(), `providers[0] (X_1): name "X_1" is not a DNS-1123 label`) ||
			!strings.Contains(err.Error(), `providers[2] (in-cluster): name "in-cluster" is already used by providers[1]`) {
			t.Fatalf("error = %v", err)
		}
		if got == nil || len(got) != 0 {
			t.Fatalf("built %v from an invalid config, want an empty map", got)
		}
	})
}
