package hetzner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/internal/testkit/hcloudapi"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
)

const (
	testLocation = "fsn1"
	testUID      = "0b6f2a3c-1111-4222-8333-444455556666"
)

// tokenFile writes a token as a mounted Secret holds it and returns its
// path.
func tokenFile(t *testing.T, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, token)
	return path
}

func writeToken(t *testing.T, path, token string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// newTestProvider returns the provider on the real hcloud-go client,
// pointed at a fresh in-test Hetzner Cloud API, with the token from a file.
func newTestProvider(t *testing.T, mutate func(*Config)) (*Provider, *hcloudapi.API) {
	t.Helper()
	api := hcloudapi.Start(t)
	cfg := Config{
		Location:     testLocation,
		Entry:        "hetzner-fsn",
		Defaults:     providers.Placement{MachineType: "cx22"},
		SourceRanges: []string{"203.0.113.0/24", "2001:db8:1::/48"},
		Endpoint:     api.Endpoint(),
		TokenFile:    tokenFile(t, hcloudapi.DefaultToken),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, api
}

// testCloudInit is the user-data of testRequest: a Proxy's own, so that
// tests about calls and answers do not each pay for the bootstrap's bcrypt
// hash (seconds under -race). bootstrapRequest is a request for the
// bootstrap.
const testCloudInit = "#cloud-config\nruncmd: [[echo, test]]\n"

func testRequest() providers.CreateRequest {
	r := bootstrapRequest()
	r.CloudInit = []byte(testCloudInit)
	return r
}

// bootstrapRequest is testRequest without user-data of its own: the
// provider boots its bootstrap with the request's login.
func bootstrapRequest() providers.CreateRequest {
	return providers.CreateRequest{
		Name:     providers.NameFromUID(testUID),
		OwnerUID: testUID, OwnerName: "eu-1", OwnerNamespace: "crawl",
		Installation: "cluster-a",
		Port:         3128,
		ProxyAuth:    &providers.BasicAuth{Username: "proxyfleet", Password: "s3cret-password-for-tests"},
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func serverID(t *testing.T, providerID string) int64 {
	t.Helper()
	id, err := parseProviderID(providerID)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// passwordFileUser reads the user of the bootstrap's login file from a
// cloud-config.
func passwordFileUser(t *testing.T, userData string) string {
	t.Helper()
	var cc struct {
		WriteFiles []struct{ Path, Content string } `json:"write_files"`
	}
	if err := yaml.Unmarshal([]byte(userData), &cc); err != nil || !strings.HasPrefix(userData, "#cloud-config\n") {
		t.Fatalf("user-data is not a cloud-config (%v):\n%s", err, userData)
	}
	for _, f := range cc.WriteFiles {
		if f.Path == bootstrap.PasswordFilePath {
			u, _, _ := strings.Cut(f.Content, ":")
			return u
		}
	}
	return ""
}

func TestCreateMakesOneLabelledServerBootingTheBootstrap(t *testing.T) {
	p, api := newTestProvider(t, func(c *Config) {
		c.Labels = map[string]string{"team": "crawl"}
		c.SSHKeys = []int64{4711}
	})
	req := bootstrapRequest()
	req.Labels = map[string]string{"pool": "eu", LabelOwnerUID: "forged"}
	inst, err := p.Create(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	all := api.Servers()
	if len(all) != 1 {
		t.Fatalf("servers = %+v, want one", all)
	}
	s := all[0]
	if want := formatProviderID(s.ID); inst.ProviderID != want || inst.State != providers.StateProvisioning || inst.OwnerUID != testUID ||
		inst.Installation != "cluster-a" || inst.Name != req.Name || inst.CreatedAt.IsZero() {
		t.Fatalf("Create = %+v, want %s Provisioning, owned, named", inst, want)
	}
	wantLabels := map[string]string{LabelManagedBy: ManagedBy, LabelOwnerUID: testUID, LabelInstallation: "cluster-a",
		LabelProxyNamespace: "crawl", LabelProxyName: "eu-1", "team": "crawl", "pool": "eu"}
	if !maps.Equal(s.Labels, wantLabels) {
		t.Errorf("labels = %v, want %v", s.Labels, wantLabels)
	}
	if s.Name != req.Name || s.Location != testLocation || s.Type != "cx22" || s.Image != DefaultImage || !s.EnableIPv4 || !s.EnableIPv6 ||
		!slices.Equal(s.SSHKeys, []int64{4711}) || !s.StartAfterCreateSent {
		t.Errorf("created %+v", s)
	}
	fws := api.Firewalls()
	if len(fws) != 1 || !slices.Equal(s.Firewalls, []int64{fws[0].ID}) {
		t.Fatalf("server firewalls %v, firewalls %+v: want the managed one applied from the create", s.Firewalls, fws)
	}
	if u := passwordFileUser(t, s.UserData); u != "proxyfleet" || strings.Contains(s.UserData, req.ProxyAuth.Password) {
		t.Fatalf("password file for %q, want proxyfleet's hash and never the password", u)
	}
	want := []string{hcloudapi.ListFirewalls, hcloudapi.CreateFirewall, hcloudapi.ListServers, hcloudapi.CreateServer}
	if got := api.Ops()[len(api.Ops())-4:]; !slices.Equal(got, want) {
		t.Fatalf("calls = %v, want %v (the look-up before the create, no waiting)", got, want)
	}
	for _, c := range api.Calls() {
		if c.Authorization != "Bearer "+hcloudapi.DefaultToken {
			t.Fatalf("%s sent Authorization %q, want the token", c.Op, c.Authorization)
		}
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(api.Calls()[len(api.Calls())-1].Body), &body); err != nil || body["image"] != DefaultImage || body["server_type"] != "cx22" {
		t.Fatalf("create body %v (%v): want the image and type by name", body, err)
	}
}

func TestIPv6OnlyServersHaveNoIPv4AndTheirPrefixsFirstAddress(t *testing.T) {
	p, api := newTestProvider(t, func(c *Config) { c.IPv6Only = true })
	inst, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	s := api.Servers()[0]
	if s.EnableIPv4 || !s.EnableIPv6 {
		t.Fatalf("public net ipv4 %v ipv6 %v, want IPv6 only", s.EnableIPv4, s.EnableIPv6)
	}
	api.SetStatus(s.ID, hcloudapi.StatusRunning)
	api.SetAddresses(s.ID, "", "2001:db8:1:2::/64")
	if got, err := p.Get(ctx(t), inst.ProviderID); err != nil || got.State != providers.StateRunning || got.IP != "2001:db8:1:2::1" {
		t.Fatalf("Get = %+v, %v; want Running at the /64's ::1", got, err)
	}
}

func TestCreateUsesTheUsersCloudInitAsIs(t *testing.T) {
	p, api := newTestProvider(t, nil)
	req := testRequest()
	req.ProxyAuth = nil
	req.CloudInit = []byte("#cloud-config\nruncmd: [[echo, mine]]\n")
	if _, err := p.Create(ctx(t), req); err != nil {
		t.Fatal(err)
	}
	if ud := api.Servers()[0].UserData; ud != string(req.CloudInit) {
		t.Fatalf("user-data = %q, want the Proxy's own cloud-init", ud)
	}
}

func rulesText(rs []hcloudapi.Rule) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Direction+"/"+r.Protocol+"/"+r.Port+"/"+strings.Join(r.IPs, ","))
	}
	return out
}

func TestFirewallAdmitsTheProxyPortFromSourceRangesOnly(t *testing.T) {
	p, api := newTestProvider(t, nil)
	if _, err := p.Create(ctx(t), testRequest()); err != nil {
		t.Fatal(err)
	}
	fws := api.Firewalls()
	if len(fws) != 1 || fws[0].Name != "proxyfleet-hetzner-fsn-cluster-a" || fws[0].Labels[LabelManagedBy] != ManagedBy || fws[0].Labels[LabelInstallation] != "cluster-a" {
		t.Fatalf("firewalls = %+v, want the managed one", fws)
	}
	fw := fws[0]
	if got, want := rulesText(fw.Rules), []string{"in/tcp/3128/203.0.113.0/24,2001:db8:1::/48"}; !slices.Equal(got, want) {
		t.Fatalf("rules = %v, want %v (no SSH, no outbound rule: all outbound allowed)", got, want)
	}

	// A rule added by hand is dropped by the next Create; another Proxy's
	// port joins the first's.
	fw.Rules = append(fw.Rules, hcloudapi.Rule{Direction: "in", Protocol: "tcp", Port: "22", IPs: []string{"0.0.0.0/0"}},
		hcloudapi.Rule{Direction: "in", Protocol: "udp", Port: "53", IPs: []string{"203.0.113.0/24"}},
		hcloudapi.Rule{Direction: "out", Protocol: "tcp", Port: "25", IPs: []string{"0.0.0.0/0"}})
	api.PutFirewall(fw)
	other := testRequest()
	other.OwnerUID, other.Name, other.Port = "7c1d0000-2222-4333-8444-555566667777", providers.NameFromUID("7c1d0000-2222-4333-8444-555566667777"), 8080
	if _, err := p.Create(ctx(t), other); err != nil {
		t.Fatal(err)
	}
	if got, want := rulesText(api.Firewalls()[0].Rules), []string{"in/tcp/3128/203.0.113.0/24,2001:db8:1::/48", "in/tcp/8080/203.0.113.0/24,2001:db8:1::/48"}; !slices.Equal(got, want) {
		t.Fatalf("rules = %v, want %v", got, want)
	}
	before := api.CallCount(hcloudapi.SetFirewallRules)
	third := testRequest()
	third.OwnerUID, third.Name = "9e2f0000-3333-4444-8555-666677778888", providers.NameFromUID("9e2f0000-3333-4444-8555-666677778888")
	if _, err := p.Create(ctx(t), third); err != nil {
		t.Fatal(err)
	}
	if n := api.CallCount(hcloudapi.SetFirewallRules); n != before {
		t.Fatalf("rules set %d times for a port already open", n-before)
	}

	// SSH only from sshSourceRanges, and only when they are configured.
	p2, api2 := newTestProvider(t, func(c *Config) { c.SSHSourceRanges = []string{"192.0.2.10/32"} })
	if _, err := p2.Create(ctx(t), testRequest()); err != nil {
		t.Fatal(err)
	}
	if got, want := rulesText(api2.Firewalls()[0].Rules), []string{"in/tcp/3128/203.0.113.0/24,2001:db8:1::/48", "in/tcp/22/192.0.2.10/32"}; !slices.Equal(got, want) {
		t.Fatalf("rules with sshSourceRanges = %v, want %v", got, want)
	}
}

func TestAFirewallOfThatNameNotProxyfleetsIsNeverTakenOver(t *testing.T) {
	p, api := newTestProvider(t, nil)
	open := hcloudapi.Firewall{Name: "proxyfleet-hetzner-fsn-cluster-a", Rules: []hcloudapi.Rule{{Direction: "in", Protocol: "tcp", Port: "22", IPs: []string{"0.0.0.0/0"}}}}
	api.PutFirewall(open)
	_, err := p.Create(ctx(t), testRequest())
	if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "proxyfleet-hetzner-fsn-cluster-a exists but is not proxyfleet's") {
		t.Fatalf("err = %v, want Permanent naming the firewall", err)
	}
	if fws := api.Firewalls(); len(fws) != 1 || !slices.Equal(rulesText(fws[0].Rules), rulesText(open.Rules)) || len(api.Servers()) != 0 {
		t.Fatalf("firewalls %+v, servers %d: someone's firewall must stay as it was and nothing be created", fws, len(api.Servers()))
	}
}

func TestCreateIsIdempotentByName(t *testing.T) {
	p, api := newTestProvider(t, nil)
	first, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	id := serverID(t, first.ProviderID)
	api.SetStatus(id, hcloudapi.StatusRunning)
	api.SetAddresses(id, "198.51.100.7", "2001:db8:1:7::/64")
	again, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if again.ProviderID != first.ProviderID || again.State != providers.StateRunning || again.IP != "198.51.100.7" {
		t.Fatalf("retried Create = %+v, want the running server %s", again, first.ProviderID)
	}
	if n, c := len(api.Servers()), api.CallCount(hcloudapi.CreateServer); n != 1 || c != 1 {
		t.Fatalf("servers = %d, creates = %d; want one, created once", n, c)
	}

	// A server of that name that is not this Proxy's is never adopted,
	// and none can be made beside it.
	p2, api2 := newTestProvider(t, nil)
	api2.Put(hcloudapi.Server{Name: providers.NameFromUID(testUID), Labels: map[string]string{"app": "web"}})
	if _, err := p2.Create(ctx(t), testRequest()); !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "is not this Proxy's") {
		t.Fatalf("a stranger of the same name: %v, want Permanent", err)
	}
	if n := api2.CallCount(hcloudapi.CreateServer); n != 0 {
		t.Fatalf("creates = %d beside a stranger of the same name", n)
	}
}

// TestCreateWhoseAnswerIsLostMakesOneServer: Hetzner made the server but
// its answer was a 500, or never came. The Create fails Transient; the
// reconciler's retry looks the server up by name and finds it.
func TestCreateWhoseAnswerIsLostMakesOneServer(t *testing.T) {
	for _, tt := range []struct {
		name string
		lose func(*hcloudapi.API)
		hang bool
	}{
		{"answered 500 after the create", func(a *hcloudapi.API) {
			a.FailAfter(hcloudapi.CreateServer, hcloudapi.Error{Status: 500, Code: "server_error", Message: "internal server error"})
		}, false},
		{"the answer never arrives", func(a *hcloudapi.API) { a.HangAfter(hcloudapi.CreateServer, 1) }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, api := newTestProvider(t, nil)
			tt.lose(api)
			c := ctx(t)
			if tt.hang {
				var cancel context.CancelFunc
				c, cancel = context.WithCancel(c)
				defer cancel()
				go func() {
					for api.CallCount(hcloudapi.CreateServer) == 0 && c.Err() == nil {
						time.Sleep(10 * time.Millisecond)
					}
					cancel()
				}()
			}
			_, err := p.Create(c, testRequest())
			if providers.Class(err) != providers.ErrTransient {
				t.Fatalf("lost answer: err = %v, want Transient", err)
			}
			if n := len(api.Servers()); n != 1 {
				t.Fatalf("servers after the lost answer = %d, want the 1 the cloud made", n)
			}
			inst, err := p.Create(ctx(t), testRequest())
			if err != nil {
				t.Fatalf("retried Create: %v", err)
			}
			all := api.Servers()
			if len(all) != 1 || inst.ProviderID != formatProviderID(all[0].ID) {
				t.Fatalf("servers = %+v, Create = %+v: want exactly the one server", all, inst)
			}
			if n := api.CallCount(hcloudapi.CreateServer); n != 1 {
				t.Fatalf("server creates = %d, want 1 (the retry found it; no SDK retry)", n)
			}
		})
	}
}

// TestACreateRacingItsLostTwinFindsIt: the look-up saw nothing, but by the
// create the lost create's server exists (its answer was on its way):
// Hetzner refuses the name, and Create looks again and returns that server.
func TestACreateRacingItsLostTwinFindsIt(t *testing.T) {
	p, api := newTestProvider(t, nil)
	req := testRequest()
	// The look-up answers an empty list once, as if the twin's create
	// were not visible yet.
	twin := api.Put(hcloudapi.Server{Name: req.Name, Status: hcloudapi.StatusInitializing, Labels: map[string]string{LabelManagedBy: ManagedBy, LabelOwnerUID: testUID}})
	p.client = newClient(p.cfg, &emptyFirstList{base: tracedTransport()})
	inst, err := p.Create(ctx(t), req)
	if err != nil || inst.ProviderID != formatProviderID(twin) {
		t.Fatalf("Create = %+v, %v; want the twin %d", inst, err, twin)
	}
	if n, c := len(api.Servers()), api.CallCount(hcloudapi.CreateServer); n != 1 || c != 1 {
		t.Fatalf("servers %d, creates %d: want the one twin, one refused create", n, c)
	}
}

// emptyFirstList answers the first server look-up by name with an empty
// list, as the API would before a create it has not finished is visible,
// and passes everything else on.
type emptyFirstList struct {
	base http.RoundTripper
	done atomic.Bool
}

func (e *emptyFirstList) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/servers") && r.URL.Query().Get("name") != "" && e.done.CompareAndSwap(false, true) {
		body := `{"servers": [], "meta": {"pagination": {"page": 1, "per_page": 50, "previous_page": null, "next_page": null, "last_page": 1, "total_entries": 0}}}`
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
	}
	return e.base.RoundTrip(r)
}

func TestCreateRefusesBadPlacementWithoutCalling(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mutate func(*providers.CreateRequest, *Config)
		want   string
	}{
		{"no server type", func(_ *providers.CreateRequest, c *Config) { c.Defaults.MachineType = "" }, "placement.machineType is required"},
		{"not a server type", func(r *providers.CreateRequest, _ *Config) { r.Placement.MachineType = "Large Server" }, `"Large Server" is not a server type`},
		{"not a location", func(r *providers.CreateRequest, _ *Config) { r.Placement.Zone = "Falkenstein" }, `"Falkenstein" is not a location`},
		{"not an image name", func(r *providers.CreateRequest, _ *Config) { r.Placement.Image = "Debian 12" }, "is not an image name"},
		{"no login for the bootstrap", func(r *providers.CreateRequest, _ *Config) { r.ProxyAuth, r.CloudInit = nil, nil }, "refusing to boot an open proxy"},
		{"a label that is no label", func(r *providers.CreateRequest, _ *Config) { r.Labels = map[string]string{"team": "web crawl"} }, "is not a label value"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := testRequest()
			p, api := newTestProvider(t, func(c *Config) { tt.mutate(&req, c) })
			_, err := p.Create(ctx(t), req)
			if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want Permanent saying %q", err, tt.want)
			}
			if calls := api.Ops(); len(calls) != 0 {
				t.Fatalf("a refused request reached the API: %v", calls)
			}
		})
	}
}

func TestGetFollowsTheServerFromInitializingToRunning(t *testing.T) {
	for _, tt := range []struct {
		name       string
		status     string
		ipv4, ipv6 string
		wantState  providers.State
		wantIP     string
	}{
		{"initializing", hcloudapi.StatusInitializing, "", "", providers.StateProvisioning, ""},
		{"starting", hcloudapi.StatusStarting, "198.51.100.9", "2001:db8:1:9::/64", providers.StateProvisioning, ""},
		{"running without an address yet", hcloudapi.StatusRunning, "", "", providers.StateProvisioning, ""},
		{"running with one", hcloudapi.StatusRunning, "198.51.100.9", "2001:db8:1:9::/64", providers.StateRunning, "198.51.100.9"},
		{"migrating", "migrating", "198.51.100.9", "", providers.StateProvisioning, ""},
		{"stopping", hcloudapi.StatusStopping, "198.51.100.9", "", providers.StateStopped, ""},
		{"off", hcloudapi.StatusOff, "198.51.100.9", "", providers.StateStopped, ""},
		{"deleting", hcloudapi.StatusDeleting, "198.51.100.9", "", providers.StateTerminated, ""},
		{"a status Hetzner may add", "hibernating", "198.51.100.9", "", providers.StateStopped, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, api := newTestProvider(t, nil)
			inst, err := p.Create(ctx(t), testRequest())
			if err != nil {
				t.Fatal(err)
			}
			id := serverID(t, inst.ProviderID)
			api.SetStatus(id, tt.status)
			api.SetAddresses(id, tt.ipv4, tt.ipv6)
			got, err := p.Get(ctx(t), inst.ProviderID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != tt.wantState || got.IP != tt.wantIP || got.OwnerUID != testUID || got.Installation != "cluster-a" || got.CreatedAt.IsZero() || got.ProviderID != inst.ProviderID {
				t.Fatalf("Get = %+v, want %s at %q, owned, with its creation time", got, tt.wantState, tt.wantIP)
			}
		})
	}
}

func TestGetOfMissingOrForeignServerIsNotFound(t *testing.T) {
	p, api := newTestProvider(t, nil)
	stranger := api.Put(hcloudapi.Server{Name: "web-1"})
	for _, id := range []string{formatProviderID(99999999), formatProviderID(stranger)} {
		if _, err := p.Get(ctx(t), id); !errors.Is(err, providers.ErrNotFound) {
			t.Errorf("Get(%s) err = %v, want NotFound", id, err)
		}
	}
}

func TestMalformedProviderIDIsPermanentAndCallsNothing(t *testing.T) {
	p, api := newTestProvider(t, nil)
	for _, id := range []string{"", "12345", "hcloud://", "hcloud://-1", "hcloud://0", "hcloud://012", "hcloud://12/3", "digitalocean://12345"} {
		if _, err := p.Get(ctx(t), id); !errors.Is(err, providers.ErrPermanent) {
			t.Errorf("Get(%q) err = %v, want Permanent", id, err)
		}
		if err := p.Delete(ctx(t), id); !errors.Is(err, providers.ErrPermanent) {
			t.Errorf("Delete(%q) err = %v, want Permanent", id, err)
		}
	}
	if calls := api.Ops(); len(calls) != 0 {
		t.Fatalf("malformed IDs reached the API: %v", calls)
	}
}

func TestDeleteDeletesAndToleratesAGoneServer(t *testing.T) {
	p, api := newTestProvider(t, nil)
	inst, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx(t), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if n := len(api.Servers()); n != 0 {
		t.Fatalf("servers after Delete = %d", n)
	}
	if _, err := p.Get(ctx(t), inst.ProviderID); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("Get once deleted: err = %v, want NotFound", err)
	}
	if err := p.Delete(ctx(t), inst.ProviderID); err != nil {
		t.Fatalf("deleting a server that is gone must succeed: %v", err)
	}
	if n := api.CallCount(hcloudapi.DeleteServer); n != 2 {
		t.Fatalf("deletes = %d, want 2", n)
	}
	api.Fail(hcloudapi.DeleteServer, hcloudapi.Error{Status: 403, Code: "protected", Message: "server is delete protected"})
	if err := p.Delete(ctx(t), inst.ProviderID); !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "server is delete protected") {
		t.Fatalf("a refused Delete: err = %v, want Permanent with the cloud's message", err)
	}
}

func TestListByTagFollowsEveryPageAndSkipsStrangers(t *testing.T) {
	p, api := newTestProvider(t, nil)
	want := map[int64]string{}
	for i, st := range []string{hcloudapi.StatusInitializing, hcloudapi.StatusRunning, hcloudapi.StatusOff, hcloudapi.StatusRunning, hcloudapi.StatusDeleting} {
		uid := "uid-" + string(rune('a'+i))
		id := api.Put(hcloudapi.Server{Status: st, Location: []string{"fsn1", "nbg1", "hel1"}[i%3], Name: "proxy-" + uid,
			Labels: map[string]string{LabelManagedBy: ManagedBy, LabelOwnerUID: uid, LabelInstallation: "cluster-" + uid}})
		want[id] = uid
	}
	api.Put(hcloudapi.Server{Name: "web-1", Labels: map[string]string{"app": "web"}})
	api.SetPageSize(2)
	got, err := p.ListByTag(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("ListByTag = %+v, want the %d managed servers", got, len(want))
	}
	for _, inst := range got {
		id, _ := parseProviderID(inst.ProviderID)
		if uid := want[id]; uid == "" || inst.OwnerUID != uid || inst.Installation != "cluster-"+uid || inst.CreatedAt.IsZero() || !slices.Equal(inst.Parts, []string{providers.PartVM}) {
			t.Errorf("%+v: want owner, installation, creation time and the vm part", inst)
		}
	}
	if n := api.CallCount(hcloudapi.ListServers); n != 3 {
		t.Fatalf("list pages = %d, want 3 (5 labelled servers, 2 a page)", n)
	}
	for _, c := range api.Calls() {
		if !strings.Contains(c.Query, "label_selector=proxyfleet.io%2Fmanaged-by%3Dproxyfleet") {
			t.Fatalf("a page without the managed selector: %s", c.Query)
		}
	}
	api.Fail(hcloudapi.ListServers, hcloudapi.Error{Status: 503, Code: "unavailable", Message: "service unavailable"})
	if got, err := p.ListByTag(ctx(t)); err == nil || got != nil {
		t.Fatalf("ListByTag with a failing page = %+v, %v; want an error and no partial list", got, err)
	}
}

// TestErrorsAreClassifiedAndTheSDKNeverRetries: every failure goes to the
// reconciler with its class and the cloud's words after exactly one
// request; hcloud-go's own retry loop would have sent more for 429, 502
// and conflict.
func TestErrorsAreClassifiedAndTheSDKNeverRetries(t *testing.T) {
	for _, tt := range []struct {
		err  hcloudapi.Error
		want error
	}{
		{hcloudapi.Quota, providers.ErrQuotaExceeded},
		{hcloudapi.Error{Status: 412, Code: "resource_unavailable", Message: "server type cx22 is unavailable in this location"}, providers.ErrQuotaExceeded},
		{hcloudapi.Error{Status: 412, Code: "placement_error", Message: "placement failed"}, providers.ErrQuotaExceeded},
		{hcloudapi.Throttled, providers.ErrTransient},
		{hcloudapi.Error{Status: 409, Code: "conflict", Message: "the resource has changed during the request, please retry"}, providers.ErrTransient},
		{hcloudapi.Error{Status: 500, Code: "server_error", Message: "internal server error"}, providers.ErrTransient},
		{hcloudapi.Error{Status: 502, Code: "bad_gateway", Message: "bad gateway"}, providers.ErrTransient},
		{hcloudapi.Error{Status: 503, Code: "unavailable", Message: "service unavailable"}, providers.ErrTransient},
		{hcloudapi.Error{Status: 401, Code: "unauthorized", Message: "unable to authenticate"}, providers.ErrPermanent},
		{hcloudapi.Error{Status: 403, Code: "forbidden", Message: "insufficient permissions for this request"}, providers.ErrPermanent},
		{hcloudapi.Error{Status: 400, Code: "invalid_input", Message: `image "debian-9" not found`}, providers.ErrPermanent},
		{hcloudapi.Error{Status: 404, Code: "not_found", Message: "ssh key with ID '4711' not found"}, providers.ErrPermanent},
	} {
		t.Run(tt.err.Code, func(t *testing.T) {
			p, api := newTestProvider(t, nil)
			api.Fail(hcloudapi.CreateServer, tt.err)
			_, err := p.Create(ctx(t), testRequest())
			if got := providers.Class(err); got != tt.want || !strings.Contains(err.Error(), tt.err.Message) || !strings.Contains(err.Error(), tt.err.Code) {
				t.Fatalf("Create: %v (class %v), want %v with the cloud's code and message", err, got, tt.want)
			}
			if n := api.CallCount(hcloudapi.CreateServer); n != 1 {
				t.Fatalf("creates = %d: the SDK retried instead of handing the error to the reconciler", n)
			}
			if len(api.Servers()) != 0 {
				t.Fatal("a refused create left a server")
			}
		})
	}
}

// TestTheCloudsOwnRefusalsAreClassified: the stand-in's own answers, not
// a queued failure: the server limit reached, and an image, type or
// location it does not know.
func TestTheCloudsOwnRefusalsAreClassified(t *testing.T) {
	p, api := newTestProvider(t, nil)
	api.SetServerLimit(1)
	api.Put(hcloudapi.Server{Name: "web-1"})
	if _, err := p.Create(ctx(t), testRequest()); providers.Class(err) != providers.ErrQuotaExceeded || !strings.Contains(err.Error(), "server limit exceeded") {
		t.Fatalf("at the server limit: %v, want QuotaExceeded with the cloud's words", err)
	}
	api.SetServerLimit(0)
	for _, tt := range []struct{ field, value, want string }{
		{"image", "debian-9", `image "debian-9" not found`}, {"type", "cx99", `server type "cx99" not found`}, {"location", "xyz1", `location "xyz1" not found`},
	} {
		req := testRequest()
		switch tt.field {
		case "image":
			req.Placement.Image = tt.value
		case "type":
			req.Placement.MachineType = tt.value
		case "location":
			req.Placement.Zone = tt.value
		}
		if _, err := p.Create(ctx(t), req); !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), tt.want) {
			t.Fatalf("unknown %s: %v, want Permanent with the cloud's message", tt.field, err)
		}
	}
	if n := len(api.Servers()); n != 1 {
		t.Fatalf("servers = %d, want only the one put there", n)
	}
}

func TestThrottlingThenSuccess(t *testing.T) {
	p, api := newTestProvider(t, nil)
	inst, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	api.Fail(hcloudapi.GetServer, hcloudapi.Throttled)
	if _, err := p.Get(ctx(t), inst.ProviderID); providers.Class(err) != providers.ErrTransient || !strings.Contains(err.Error(), "rate_limit_exceeded") {
		t.Fatalf("throttled Get: %v, want Transient", err)
	}
	if got, err := p.Get(ctx(t), inst.ProviderID); err != nil || got.State != providers.StateProvisioning {
		t.Fatalf("the reconciler's retry: %+v, %v", got, err)
	}
	if n := api.CallCount(hcloudapi.GetServer); n != 2 {
		t.Fatalf("gets = %d, want 2: one throttled, one retried by the caller", n)
	}
}

func TestBadTokenIsPermanentAndARotatedTokenIsReadAgain(t *testing.T) {
	var path string
	p, api := newTestProvider(t, func(c *Config) { path = c.TokenFile })
	writeToken(t, path, "revoked-token")
	_, err := p.Create(ctx(t), testRequest())
	if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "unable to authenticate (unauthorized") {
		t.Fatalf("Create with a bad token: %v, want Permanent with the cloud's message", err)
	}
	if strings.Contains(err.Error(), "revoked-token") {
		t.Fatal("the error carries the token")
	}
	st := p.Check(ctx(t))
	if len(st) != 1 || st[0].Ready || st[0].Reason != "Unauthorized" || !strings.Contains(st[0].Message, "unable to authenticate") {
		t.Fatalf("Check with a bad token = %+v", st)
	}
	writeToken(t, path, hcloudapi.DefaultToken)
	if _, err := p.Create(ctx(t), testRequest()); err != nil {
		t.Fatalf("Create after the token was rotated: %v", err)
	}
	if st := p.Check(ctx(t)); !st[0].Ready {
		t.Fatalf("Check after the token was rotated = %+v", st)
	}
	var sawWrong, sawRight bool
	for _, c := range api.Calls() {
		sawWrong = sawWrong || c.Authorization == "Bearer revoked-token"
		sawRight = sawRight || c.Authorization == "Bearer "+hcloudapi.DefaultToken
	}
	if !sawWrong || !sawRight {
		t.Fatal("the token file was not read on every request")
	}
}

func TestMissingTokenFileIsTransientAndSendsNothing(t *testing.T) {
	var path string
	p, api := newTestProvider(t, func(c *Config) { path = c.TokenFile })
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	_, err := p.Get(ctx(t), formatProviderID(12345))
	if providers.Class(err) != providers.ErrTransient || !strings.Contains(err.Error(), "not mounted") {
		t.Fatalf("err = %v, want Transient naming the unmounted Secret", err)
	}
	if st := p.Check(ctx(t)); st[0].Ready || st[0].Reason != "CredentialsUnreadable" {
		t.Fatalf("Check = %+v", st)
	}
	writeToken(t, path, "")
	if _, err := p.Get(ctx(t), formatProviderID(12345)); !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("an empty token file: %v, want Permanent", err)
	}
	if n := len(api.Calls()); n != 0 {
		t.Fatalf("%d requests went out without a token", n)
	}
}

func TestCheckListsOneServerOnAFreshConnection(t *testing.T) {
	for _, tt := range []struct {
		name       string
		fail       *hcloudapi.Error
		wantReady  bool
		wantReason string
	}{
		{"a working token", nil, true, "OK"},
		{"a token of another kind", &hcloudapi.Error{Status: 403, Code: "forbidden", Message: "insufficient permissions for this request"}, false, "Forbidden"},
		{"throttled", &hcloudapi.Throttled, false, "Throttled"},
		{"down", &hcloudapi.Error{Status: 500, Code: "server_error", Message: "internal server error"}, false, "Unavailable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, api := newTestProvider(t, nil)
			if tt.fail != nil {
				api.Fail(hcloudapi.ListServers, *tt.fail)
			}
			got := p.Check(ctx(t))
			if len(got) != 1 || got[0].Target != testLocation || got[0].Ready != tt.wantReady || got[0].Reason != tt.wantReason {
				t.Fatalf("Check = %+v, want target %s ready=%v %s", got, testLocation, tt.wantReady, tt.wantReason)
			}
			calls := api.Calls()
			if len(calls) != 1 || !strings.Contains(calls[0].Query, "per_page=1") || !strings.Contains(calls[0].Query, "label_selector=") {
				t.Fatalf("calls = %+v, want one page of 1 managed server", calls)
			}
		})
	}
	p, api := newTestProvider(t, nil)
	api.Close()
	if got := p.Check(ctx(t)); got[0].Ready || got[0].Reason != "Unreachable" {
		t.Fatalf("Check of a closed endpoint = %+v, want Unreachable", got)
	}
}

func TestNetworkErrorsAreTransient(t *testing.T) {
	p, api := newTestProvider(t, nil)
	api.Close()
	if _, err := p.Get(ctx(t), formatProviderID(12345)); providers.Class(err) != providers.ErrTransient {
		t.Fatalf("err = %v, want Transient", err)
	}
}
