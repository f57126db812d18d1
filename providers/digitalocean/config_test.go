package digitalocean

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testkit/doapi"
	"github.com/proxyfleet/proxyfleet/providers"
)

// parse reads a providers config file that may name this type only.
func parse(yaml string) (providers.Config, error) {
	return providers.ParseConfig([]byte(yaml), map[string]providers.Decoder{Type: providers.DecoderOf(ReadConfig)})
}

func TestReadConfigReadsEveryKey(t *testing.T) {
	cfg, err := parse(`
providers:
  - name: do-ams
    type: digitalocean
    digitalocean:
      region: ams3
      defaults: {zone: fra1, machineType: s-1vcpu-512mb-10gb, image: debian-12-x64}
      sourceRanges: [203.0.113.0/24, "2001:db8::/32"]
      sshSourceRanges: [192.0.2.10/32]
      sshKeys: ["512190", "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa"]
      vpcUUID: 5a4981aa-9653-4bd1-bef5-d6bff52042e4
      addressType: private
      ipv6: true
      tags: [team-crawl]
      hourlyPrice: 0.006
      tokenFile: /var/run/secrets/digitalocean/token
      endpoint: https://api.digitalocean.com
`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadConfig(cfg.Providers[0])
	want := Config{Region: "ams3", Entry: "do-ams",
		Defaults:     providers.Placement{Zone: "fra1", MachineType: "s-1vcpu-512mb-10gb", Image: "debian-12-x64"},
		SourceRanges: []string{"203.0.113.0/24", "2001:db8::/32"}, SSHSourceRanges: []string{"192.0.2.10/32"},
		SSHKeys: []string{"512190", "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa"}, VPCUUID: "5a4981aa-9653-4bd1-bef5-d6bff52042e4",
		AddressType: AddressPrivate, IPv6: true, Tags: []string{"team-crawl"}, HourlyPrice: 0.006,
		TokenFile: "/var/run/secrets/digitalocean/token", Endpoint: "https://api.digitalocean.com"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadConfig = %+v, %v\nwant %+v", got, err, want)
	}
	minimal, err := parse("providers: [{name: a, type: digitalocean, digitalocean: {region: nyc3, sourceRanges: [0.0.0.0/0], tokenFile: /t}}]")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ReadConfig(minimal.Providers[0]); err != nil || got.AddressType != AddressPublic {
		t.Fatalf("minimal block = %+v, %v; want addressType public", got, err)
	}
}

func TestReadConfigRejects(t *testing.T) {
	const ok = "region: ams3, sourceRanges: [203.0.113.0/24], tokenFile: /t"
	for _, tt := range []struct {
		name string
		yaml string
		want []string
	}{
		{"unknown key", "{" + ok + ", token: x}", []string{"digitalocean.token: unknown field"}},
		{"unknown key nested", "{" + ok + ", defaults: {size: s-1vcpu-1gb}}", []string{"digitalocean.defaults.size: unknown field"}},
		{"the entry name is not a key", "{" + ok + ", Entry: x}", []string{"digitalocean.Entry: unknown field"}},
		{"region", "{sourceRanges: [203.0.113.0/24], tokenFile: /t}", []string{"digitalocean.region is required"}},
		{"bad region", "{region: Amsterdam, sourceRanges: [203.0.113.0/24], tokenFile: /t}", []string{`digitalocean.region "Amsterdam" is not a region slug`}},
		{"bad size", "{" + ok + ", defaults: {machineType: 'Large Droplet'}}", []string{`digitalocean.defaults.machineType "Large Droplet" is not a size slug`}},
		{"bad image", "{" + ok + ", defaults: {image: 'Debian 12'}}", []string{`digitalocean.defaults.image "Debian 12" is not an image slug`}},
		{"no ranges", "{region: ams3, tokenFile: /t}", []string{"digitalocean.sourceRanges is required"}},
		{"not a CIDR", "{region: ams3, tokenFile: /t, sourceRanges: [203.0.113.7, 203.0.113.7/24], sshSourceRanges: [me]}",
			[]string{`digitalocean.sourceRanges[0] "203.0.113.7" is not a CIDR`, `digitalocean.sourceRanges[1] "203.0.113.7/24" has host bits set (did you mean 203.0.113.0/24?)`, `digitalocean.sshSourceRanges[0] "me" is not a CIDR`}},
		{"ssh key", "{" + ok + ", sshKeys: [my-laptop]}", []string{`digitalocean.sshKeys[0] "my-laptop" is neither a key ID nor an MD5 fingerprint`}},
		{"vpc", "{" + ok + ", vpcUUID: default}", []string{`digitalocean.vpcUUID "default" is not a VPC UUID`}},
		{"address type", "{" + ok + ", addressType: external}", []string{`digitalocean.addressType "external" is not public or private`}},
		{"reserved tag", "{" + ok + ", tags: [proxyfleet-uid:x]}", []string{`digitalocean.tags[0] "proxyfleet-uid:x": tags starting with proxyfleet are proxyfleet's own`}},
		{"bad tag", "{" + ok + ", tags: ['team/crawl']}", []string{`digitalocean.tags[0] "team/crawl": a tag is 1-255 letters`}},
		{"no token", "{region: ams3, sourceRanges: [203.0.113.0/24]}", []string{"digitalocean.tokenFile is required"}},
		{"relative token file", "{region: ams3, sourceRanges: [203.0.113.0/24], tokenFile: token}", []string{`digitalocean.tokenFile "token" must be an absolute path`}},
		{"noAuth and a token", "{" + ok + ", noAuth: true}", []string{"digitalocean.noAuth and digitalocean.tokenFile are mutually exclusive"}},
		{"endpoint with a login", "{" + ok + ", endpoint: 'https://u:p@api.example'}", []string{"digitalocean.endpoint is not an http(s) base URL without credentials"}},
		{"negative price", "{" + ok + ", hourlyPrice: -1}", []string{"digitalocean.hourlyPrice -1 is negative"}},
		{"every problem at once", "{region: x, addressType: y}", []string{`digitalocean.region "x"`, `digitalocean.addressType "y"`, "digitalocean.sourceRanges is required", "digitalocean.tokenFile is required"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse("providers:\n- name: a\n  type: digitalocean\n  digitalocean: " + tt.yaml + "\n")
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
	srv := doapi.Start(t)
	path := tokenFile(t, doapi.DefaultToken)
	cfg, err := parse("providers: [{name: do-ams, type: digitalocean, digitalocean: {region: ams3, sourceRanges: [203.0.113.0/24], endpoint: '" + srv.URL + "', tokenFile: " + path + "}}]")
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
	if c := srv.Calls(); len(c) != 1 || c[0].Authorization != "Bearer "+doapi.DefaultToken {
		t.Fatalf("calls = %+v, want one with the file's token", c)
	}

	cfg, err = parse("providers: [{name: do-ams, type: digitalocean, digitalocean: {region: ams3, sourceRanges: [203.0.113.0/24], endpoint: '" + srv.URL + "/', noAuth: true}}]")
	if err != nil {
		t.Fatal(err)
	}
	if p, err = Constructor()(cfg.Providers[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ListByTag(context.Background()); !strings.Contains(err.Error(), "Unable to authenticate you") {
		t.Fatalf("noAuth against a server that checks tokens: %v, want its refusal", err)
	}
	if c := srv.Calls(); len(c) != 2 || c[1].Authorization != "" || c[1].Path != "/v2/droplets" {
		t.Fatalf("noAuth call = %+v, want no Authorization header on /v2/droplets", c[len(c)-1])
	}
}

// FuzzReadConfig: the digitalocean block is outside input. What
// ParseConfig accepts, ReadConfig and New accept too, every tag it accepted
// is one Create takes, and its source ranges open the proxy port.
func FuzzReadConfig(f *testing.F) {
	f.Add([]byte("providers: [{name: a, type: digitalocean, digitalocean: {region: ams3, defaults: {machineType: s-1vcpu-1gb}, sourceRanges: [203.0.113.0/24], tokenFile: /t}}]"))
	f.Add([]byte("providers:\n- name: a\n  type: digitalocean\n  digitalocean:\n    region: nyc3\n    sourceRanges: ['2001:db8::/32']\n    sshSourceRanges: [192.0.2.1/32]\n    tags: [team:crawl]\n    endpoint: http://127.0.0.1:1\n    noAuth: true\n    hourlyPrice: 0.01\n"))
	f.Add([]byte("providers: [{name: a, type: digitalocean, digitalocean: {region: fra1, sourceRanges: [0.0.0.0/0], sshKeys: ['1'], vpcUUID: 5a4981aa-9653-4bd1-bef5-d6bff52042e4, tokenFile: /t, addressType: private}}]"))
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
				req.Placement.MachineType = "s-1vcpu-1gb"
			}
			if _, err := buildSpec(got, req); err != nil {
				t.Fatalf("an accepted entry refuses a plain request: %v", err)
			}
			fw := p.firewallRequest("n", "t", nil, 3128)
			if len(fw.InboundRules) == 0 || fw.InboundRules[0].PortRange != "3128" || len(fw.InboundRules[0].Sources.Addresses) == 0 {
				t.Fatalf("accepted source ranges %v that open nothing", got.SourceRanges)
			}
		}
	})
}

// TestTheConfiguredPriceIsReportedThroughDecorators: hourlyPrice is what
// the controller's proxyfleet_proxy_hourly_price reads for the entry's
// Proxies, through the decorators the registry wraps a provider in.
func TestTheConfiguredPriceIsReportedThroughDecorators(t *testing.T) {
	p, _ := newTestProvider(t, func(c *Config) { c.HourlyPrice = 0.00595 })
	if got := providers.HourlyPriceOf(providers.WithTracing(p, "do-ams")); got != 0.00595 {
		t.Fatalf("HourlyPriceOf = %v, want 0.00595", got)
	}
	p, _ = newTestProvider(t, nil)
	if got := providers.HourlyPriceOf(p); got != 0 {
		t.Fatalf("HourlyPriceOf without a price = %v, want 0", got)
	}
}
