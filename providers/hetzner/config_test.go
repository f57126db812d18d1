package hetzner

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testkit/hcloudapi"
	"github.com/proxyfleet/proxyfleet/providers"
)

// parse reads a providers config file that may name this type only.
func parse(yaml string) (providers.Config, error) {
	return providers.ParseConfig([]byte(yaml), map[string]providers.Decoder{Type: providers.DecoderOf(ReadConfig)})
}

func TestReadConfigReadsEveryKey(t *testing.T) {
	cfg, err := parse(`
providers:
  - name: hetzner-fsn
    type: hetzner
    hetzner:
      location: fsn1
      defaults: {zone: nbg1, machineType: cx22, image: debian-12}
      sourceRanges: [203.0.113.0/24, "2001:db8::/32"]
      sshSourceRanges: [192.0.2.10/32]
      sshKeys: [4711]
      ipv6Only: true
      labels: {team: crawl}
      hourlyPrice: 0.0066
      tokenFile: /var/run/secrets/hetzner/token
      endpoint: https://api.hetzner.cloud/v1
`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadConfig(cfg.Providers[0])
	want := Config{Location: "fsn1", Entry: "hetzner-fsn",
		Defaults:     providers.Placement{Zone: "nbg1", MachineType: "cx22", Image: "debian-12"},
		SourceRanges: []string{"203.0.113.0/24", "2001:db8::/32"}, SSHSourceRanges: []string{"192.0.2.10/32"},
		SSHKeys: []int64{4711}, IPv6Only: true, Labels: map[string]string{"team": "crawl"}, HourlyPrice: 0.0066,
		TokenFile: "/var/run/secrets/hetzner/token", Endpoint: "https://api.hetzner.cloud/v1"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadConfig = %+v, %v\nwant %+v", got, err, want)
	}
}

func TestReadConfigRejects(t *testing.T) {
	const ok = "location: fsn1, sourceRanges: [203.0.113.0/24], tokenFile: /t"
	for _, tt := range []struct {
		name string
		yaml string
		want []string
	}{
		{"unknown key", "{" + ok + ", token: x}", []string{"hetzner.token: unknown field"}},
		{"unknown key nested", "{" + ok + ", defaults: {serverType: cx22}}", []string{"hetzner.defaults.serverType: unknown field"}},
		{"the entry name is not a key", "{" + ok + ", Entry: x}", []string{"hetzner.Entry: unknown field"}},
		{"location", "{sourceRanges: [203.0.113.0/24], tokenFile: /t}", []string{"hetzner.location is required"}},
		{"bad location", "{location: Falkenstein, sourceRanges: [203.0.113.0/24], tokenFile: /t}", []string{`hetzner.location "Falkenstein" is not a location`}},
		{"bad type", "{" + ok + ", defaults: {machineType: 'Large Server'}}", []string{`hetzner.defaults.machineType "Large Server" is not a server type`}},
		{"bad image", "{" + ok + ", defaults: {image: 'Debian 12'}}", []string{`hetzner.defaults.image "Debian 12" is not an image name`}},
		{"no ranges", "{location: fsn1, tokenFile: /t}", []string{"hetzner.sourceRanges is required"}},
		{"not a CIDR", "{location: fsn1, tokenFile: /t, sourceRanges: [203.0.113.7, 203.0.113.7/24], sshSourceRanges: [me]}",
			[]string{`hetzner.sourceRanges[0] "203.0.113.7" is not a CIDR`, `hetzner.sourceRanges[1] "203.0.113.7/24" has host bits set (did you mean 203.0.113.0/24?)`, `hetzner.sshSourceRanges[0] "me" is not a CIDR`}},
		{"ssh key", "{" + ok + ", sshKeys: [0]}", []string{"hetzner.sshKeys[0] 0 is not an SSH key ID"}},
		{"ssh key by name", "{" + ok + ", sshKeys: [laptop]}", []string{"hetzner.sshKeys"}},
		{"reserved label", "{" + ok + ", labels: {proxyfleet.io/proxy-uid: x}}", []string{"hetzner.labels[proxyfleet.io/proxy-uid]: keys starting with proxyfleet.io/ are proxyfleet's own"}},
		{"bad label value", "{" + ok + ", labels: {team: 'web crawl'}}", []string{`hetzner.labels[team]: the value "web crawl" is not a label value`}},
		{"no token", "{location: fsn1, sourceRanges: [203.0.113.0/24]}", []string{"hetzner.tokenFile is required"}},
		{"relative token file", "{location: fsn1, sourceRanges: [203.0.113.0/24], tokenFile: token}", []string{`hetzner.tokenFile "token" must be an absolute path`}},
		{"noAuth and a token", "{" + ok + ", noAuth: true}", []string{"hetzner.noAuth and hetzner.tokenFile are mutually exclusive"}},
		{"endpoint with a login", "{" + ok + ", endpoint: 'https://u:p@api.example/v1'}", []string{"hetzner.endpoint is not an http(s) base URL without credentials"}},
		{"negative price", "{" + ok + ", hourlyPrice: -1}", []string{"hetzner.hourlyPrice -1 is negative"}},
		{"every problem at once", "{location: X}", []string{`hetzner.location "X"`, "hetzner.sourceRanges is required", "hetzner.tokenFile is required"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse("providers:\n- name: a\n  type: hetzner\n  hetzner: " + tt.yaml + "\n")
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestConstructorUsesTheBlocksClientOptions builds a provider as the binary
// does, from the file, against the in-test API: the endpoint and the token
// file reach the client, and noAuth sends no token at all.
func TestConstructorUsesTheBlocksClientOptions(t *testing.T) {
	api := hcloudapi.Start(t)
	path := tokenFile(t, hcloudapi.DefaultToken)
	cfg, err := parse("providers: [{name: h, type: hetzner, hetzner: {location: fsn1, sourceRanges: [203.0.113.0/24], endpoint: '" + api.Endpoint() + "', tokenFile: " + path + "}}]")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Constructor()(cfg.Providers[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.ListByTag(context.Background()); err != nil {
		t.Fatalf("ListByTag through the configured endpoint: %v", err)
	}
	if c := api.Calls(); len(c) != 1 || c[0].Authorization != "Bearer "+hcloudapi.DefaultToken {
		t.Fatalf("calls = %+v, want one with the file's token", c)
	}
	cfg, err = parse("providers: [{name: h, type: hetzner, hetzner: {location: fsn1, sourceRanges: [203.0.113.0/24], endpoint: '" + api.Endpoint() + "/', noAuth: true}}]")
	if err != nil {
		t.Fatal(err)
	}
	if p, err = Constructor()(cfg.Providers[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ListByTag(context.Background()); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("noAuth against a server that checks tokens: %v, want its refusal", err)
	}
	if c := api.Calls(); len(c) != 2 || c[1].Authorization != "" || c[1].Path != "/v1/servers" {
		t.Fatalf("noAuth call = %+v, want no Authorization header on /v1/servers", c[len(c)-1])
	}
}

// FuzzReadConfig: the hetzner block is outside input. What ParseConfig
// accepts, ReadConfig and New accept too, every label it accepted is one
// Create takes, and its source ranges open the proxy port.
func FuzzReadConfig(f *testing.F) {
	f.Add([]byte("providers: [{name: a, type: hetzner, hetzner: {location: fsn1, defaults: {machineType: cx22}, sourceRanges: [203.0.113.0/24], tokenFile: /t}}]"))
	f.Add([]byte("providers:\n- name: a\n  type: hetzner\n  hetzner:\n    location: hel1\n    sourceRanges: ['2001:db8::/32']\n    sshSourceRanges: [192.0.2.1/32]\n    labels: {team: crawl, example.com/x: y}\n    endpoint: http://127.0.0.1:1/v1\n    noAuth: true\n    hourlyPrice: 0.01\n"))
	f.Add([]byte("providers: [{name: a, type: hetzner, hetzner: {location: ash, sourceRanges: [0.0.0.0/0], sshKeys: [1], ipv6Only: true, tokenFile: /t}}]"))
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg, err := parse(string(in))
		if err != nil {
			return
		}
		for _, e := range cfg.Providers {
			got, err := ReadConfig(e)
			if err != nil {
				t.Fatalf("ParseConfig accepted what ReadConfig refuses: %v", err)
			}
			p, err := New(got)
			if err != nil {
				t.Fatalf("New refuses an accepted entry in %q: %v", in, err)
			}
			req := providers.CreateRequest{Name: "proxy-abc", OwnerUID: "u-1", Port: 3128, ProxyAuth: &providers.BasicAuth{Username: "u", Password: "p"}}
			if got.Defaults.MachineType == "" {
				req.Placement.MachineType = "cx22"
			}
			if _, err := buildSpec(got, req); err != nil {
				t.Fatalf("an accepted entry refuses a plain request: %v", err)
			}
			rules := p.rules(nil, 3128)
			if len(rules) == 0 || *rules[0].Port != "3128" || len(rules[0].SourceIPs) != len(got.SourceRanges) {
				t.Fatalf("accepted source ranges %v that open %+v", got.SourceRanges, rules)
			}
		}
	})
}

// TestTheConfiguredPriceIsReportedThroughDecorators: hourlyPrice is what
// the controller's proxyfleet_proxy_hourly_price reads for the entry's
// Proxies, through the decorators the registry wraps a provider in.
func TestTheConfiguredPriceIsReportedThroughDecorators(t *testing.T) {
	p, _ := newTestProvider(t, func(c *Config) { c.HourlyPrice = 0.0068 })
	if got := providers.HourlyPriceOf(providers.WithTracing(p, "hetzner-fsn")); got != 0.0068 {
		t.Fatalf("HourlyPriceOf = %v, want 0.0068", got)
	}
	p, _ = newTestProvider(t, nil)
	if got := providers.HourlyPriceOf(p); got != 0 {
		t.Fatalf("HourlyPriceOf without a price = %v, want 0", got)
	}
}
