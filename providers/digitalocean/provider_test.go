package digitalocean

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/internal/testkit/doapi"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
)

const (
	testRegion = "ams3"
	testUID    = "0b6f2a3c-1111-4222-8333-444455556666"
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

// newTestProvider returns the provider on the real godo client, pointed at
// a fresh in-test DigitalOcean API, with the token from a file.
func newTestProvider(t *testing.T, mutate func(*Config)) (*Provider, *doapi.Server) {
	t.Helper()
	srv := doapi.Start(t)
	cfg := Config{
		Region:       testRegion,
		Entry:        "do-ams",
		Defaults:     providers.Placement{MachineType: "s-1vcpu-512mb-10gb"},
		SourceRanges: []string{"203.0.113.0/24", "2001:db8:1::/48"},
		Endpoint:     srv.URL,
		TokenFile:    tokenFile(t, doapi.DefaultToken),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, srv
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

func dropletID(t *testing.T, providerID string) int {
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

func TestCreateMakesOneTaggedDropletBootingTheBootstrap(t *testing.T) {
	p, srv := newTestProvider(t, func(c *Config) {
		c.Tags = []string{"team:crawl"}
		c.SSHKeys = []string{"512190", "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa"}
		c.IPv6 = true
	})
	req := bootstrapRequest()
	req.Labels = map[string]string{"pool": "eu"}
	inst, err := p.Create(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	all := srv.Droplets()
	if len(all) != 1 {
		t.Fatalf("droplets = %+v, want one", all)
	}
	d := all[0]
	if want := "digitalocean://" + strconv.Itoa(d.ID); inst.ProviderID != want || inst.State != providers.StateProvisioning || inst.OwnerUID != testUID ||
		inst.Installation != "cluster-a" || inst.Name != req.Name || inst.CreatedAt.IsZero() {
		t.Fatalf("Create = %+v, want %s Provisioning, owned, named", inst, want)
	}
	wantTags := []string{"pool:eu", "proxyfleet", "proxyfleet-fw:do-ams:cluster-a", "proxyfleet-installation:cluster-a", "proxyfleet-uid:" + testUID, "team:crawl"}
	if !slices.Equal(d.Tags, wantTags) {
		t.Errorf("tags = %v, want %v", d.Tags, wantTags)
	}
	if d.Name != req.Name || d.Region != testRegion || d.Size != "s-1vcpu-512mb-10gb" || d.Image != DefaultImage || !d.WantIPv6 {
		t.Errorf("created %+v", d)
	}
	if !slices.Equal(d.SSHKeys, []string{"512190", "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa"}) {
		t.Errorf("ssh keys = %v", d.SSHKeys)
	}
	// The user-data is the bootstrap with the Proxy's own login.
	if u := passwordFileUser(t, d.UserData); u != "proxyfleet" || strings.Contains(d.UserData, req.ProxyAuth.Password) {
		t.Fatalf("password file for %q, want proxyfleet's hash and never the password", u)
	}
	want := []string{doapi.ListFirewalls, doapi.CreateTag, doapi.CreateFirewall, doapi.ListDroplets, doapi.CreateDroplet}
	if got := srv.Ops(); !slices.Equal(got, want) {
		t.Fatalf("calls = %v, want %v (the look-up before the create, no waiting)", got, want)
	}
	for _, c := range srv.Calls() {
		if c.Authorization != "Bearer "+doapi.DefaultToken {
			t.Fatalf("%s sent Authorization %q, want the token", c.Op, c.Authorization)
		}
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(srv.Calls()[4].Body), &body); err != nil || body["image"] != DefaultImage || body["with_droplet_agent"] != false || body["backups"] != false {
		t.Fatalf("create body %v (%v): want the image by slug, no agent, no backups", body, err)
	}
}

func TestCreateUsesTheUsersCloudInitAsIs(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	req := testRequest()
	req.ProxyAuth = nil
	req.CloudInit = []byte("#cloud-config\nruncmd: [[echo, mine]]\n")
	if _, err := p.Create(ctx(t), req); err != nil {
		t.Fatal(err)
	}
	if ud := srv.Droplets()[0].UserData; ud != string(req.CloudInit) {
		t.Fatalf("user-data = %q, want the Proxy's own cloud-init", ud)
	}
}

func rulesText(rs []doapi.Rule) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Protocol+"/"+r.Ports+"/"+strings.Join(r.Addresses, ","))
	}
	return out
}

func TestFirewallAdmitsTheProxyPortFromSourceRangesOnly(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	if _, err := p.Create(ctx(t), testRequest()); err != nil {
		t.Fatal(err)
	}
	fws := srv.Firewalls()
	if len(fws) != 1 || fws[0].Name != "proxyfleet-do-ams-cluster-a" || !slices.Equal(fws[0].Tags, []string{"proxyfleet-fw:do-ams:cluster-a"}) {
		t.Fatalf("firewalls = %+v, want the managed one on the entry's tag", fws)
	}
	fw := fws[0]
	if got, want := rulesText(fw.Inbound), []string{"tcp/3128/203.0.113.0/24,2001:db8:1::/48"}; !slices.Equal(got, want) {
		t.Fatalf("inbound = %v, want %v (no SSH)", got, want)
	}
	if got, want := rulesText(fw.Outbound), []string{"tcp/0/0.0.0.0/0,::/0", "udp/0/0.0.0.0/0,::/0", "icmp//0.0.0.0/0,::/0"}; !slices.Equal(got, want) {
		t.Fatalf("outbound = %v, want %v", got, want)
	}

	// A rule added by hand is dropped by the next Create; another Proxy's
	// port joins the first's.
	fw.Inbound = append(fw.Inbound, doapi.Rule{Protocol: "tcp", Ports: "22", Addresses: []string{"0.0.0.0/0"}}, doapi.Rule{Protocol: "udp", Ports: "53", Addresses: []string{"203.0.113.0/24"}})
	srv.PutFirewall(fw)
	other := testRequest()
	other.OwnerUID, other.Name, other.Port = "7c1d0000-2222-4333-8444-555566667777", providers.NameFromUID("7c1d0000-2222-4333-8444-555566667777"), 8080
	if _, err := p.Create(ctx(t), other); err != nil {
		t.Fatal(err)
	}
	if got, want := rulesText(srv.Firewalls()[0].Inbound), []string{"tcp/3128/203.0.113.0/24,2001:db8:1::/48", "tcp/8080/203.0.113.0/24,2001:db8:1::/48"}; !slices.Equal(got, want) {
		t.Fatalf("inbound = %v, want %v", got, want)
	}
	// Nothing to change: no update.
	before := srv.CallCount(doapi.UpdateFirewall)
	third := testRequest()
	third.OwnerUID, third.Name = "9e2f0000-3333-4444-8555-666677778888", providers.NameFromUID("9e2f0000-3333-4444-8555-666677778888")
	if _, err := p.Create(ctx(t), third); err != nil {
		t.Fatal(err)
	}
	if n := srv.CallCount(doapi.UpdateFirewall); n != before {
		t.Fatalf("firewall updated %d times for a port already open", n-before)
	}

	// SSH only from sshSourceRanges, and only when they are configured.
	p2, srv2 := newTestProvider(t, func(c *Config) { c.SSHSourceRanges = []string{"192.0.2.10/32"} })
	if _, err := p2.Create(ctx(t), testRequest()); err != nil {
		t.Fatal(err)
	}
	if got, want := rulesText(srv2.Firewalls()[0].Inbound), []string{"tcp/3128/203.0.113.0/24,2001:db8:1::/48", "tcp/22/192.0.2.10/32"}; !slices.Equal(got, want) {
		t.Fatalf("inbound with sshSourceRanges = %v, want %v", got, want)
	}
}

// TestAFirewallOfThatNameNotProxyfleetsIsNeverTakenOver: a firewall named
// as the managed one but applying to anything else belongs to someone;
// Create fails Permanent naming it, changes nothing and creates nothing.
func TestAFirewallOfThatNameNotProxyfleetsIsNeverTakenOver(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	open := doapi.Firewall{Name: "proxyfleet-do-ams-cluster-a", Tags: []string{"web"}, Inbound: []doapi.Rule{{Protocol: "tcp", Ports: "22", Addresses: []string{"0.0.0.0/0"}}}}
	srv.PutFirewall(open)
	_, err := p.Create(ctx(t), testRequest())
	if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "proxyfleet-do-ams-cluster-a exists but is not proxyfleet's") {
		t.Fatalf("err = %v, want Permanent naming the firewall", err)
	}
	if fws := srv.Firewalls(); len(fws) != 1 || !slices.Equal(rulesText(fws[0].Inbound), rulesText(open.Inbound)) || len(srv.Droplets()) != 0 {
		t.Fatalf("firewalls %+v, droplets %d: someone's firewall must stay as it was and nothing be created", fws, len(srv.Droplets()))
	}
}

func TestCreateIsIdempotentByNameAndTag(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	// A droplet of the same name that is not proxyfleet's is never adopted.
	stranger := srv.Put(doapi.Droplet{Name: providers.NameFromUID(testUID), Tags: []string{"web"}})
	first, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	id := dropletID(t, first.ProviderID)
	if id == stranger {
		t.Fatal("Create adopted a droplet that is not proxyfleet's")
	}
	srv.SetStatus(id, doapi.StatusActive)
	srv.SetAddresses(id, "198.51.100.7", "10.110.0.7", "")
	again, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if again.ProviderID != first.ProviderID || again.State != providers.StateRunning || again.IP != "198.51.100.7" {
		t.Fatalf("retried Create = %+v, want the running droplet %s", again, first.ProviderID)
	}
	if n, c := len(srv.Droplets()), srv.CallCount(doapi.CreateDroplet); n != 2 || c != 1 {
		t.Fatalf("droplets = %d, creates = %d; want the stranger and one of ours, created once", n, c)
	}
}

// TestCreateWhoseAnswerIsLostMakesOneDroplet: DigitalOcean made the droplet
// but its answer was a 500, or never came. The Create fails Transient; the
// reconciler's retry looks the droplet up by name and tag and finds it.
func TestCreateWhoseAnswerIsLostMakesOneDroplet(t *testing.T) {
	for _, tt := range []struct {
		name string
		lose func(*doapi.Server)
		hang bool
	}{
		{"answered 500 after the create", func(s *doapi.Server) {
			s.FailAfter(doapi.CreateDroplet, doapi.Error{Status: 500, ID: "server_error", Message: "Server was unable to give you a response."})
		}, false},
		{"the answer never arrives", func(s *doapi.Server) { s.HangAfter(doapi.CreateDroplet, 1) }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, nil)
			tt.lose(srv)
			c := ctx(t)
			if tt.hang {
				// The client gives up once the cloud has the create (a
				// fixed timeout could run out before it is even sent on a
				// busy machine).
				var cancel context.CancelFunc
				c, cancel = context.WithCancel(c)
				defer cancel()
				go func() {
					for srv.CallCount(doapi.CreateDroplet) == 0 && c.Err() == nil {
						time.Sleep(10 * time.Millisecond)
					}
					cancel()
				}()
			}
			_, err := p.Create(c, testRequest())
			if providers.Class(err) != providers.ErrTransient {
				t.Fatalf("lost answer: err = %v, want Transient", err)
			}
			if n := len(srv.Droplets()); n != 1 {
				t.Fatalf("droplets after the lost answer = %d, want the 1 the cloud made", n)
			}
			inst, err := p.Create(ctx(t), testRequest())
			if err != nil {
				t.Fatalf("retried Create: %v", err)
			}
			all := srv.Droplets()
			if len(all) != 1 || inst.ProviderID != formatProviderID(all[0].ID) {
				t.Fatalf("droplets = %+v, Create = %+v: want exactly the one droplet", all, inst)
			}
			if n := srv.CallCount(doapi.CreateDroplet); n != 1 {
				t.Fatalf("droplet creates = %d, want 1 (the retry found it; no SDK retry)", n)
			}
		})
	}
}

func TestCreateRefusesBadPlacementWithoutCalling(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mutate func(*providers.CreateRequest, *Config)
		want   string
	}{
		{"no size", func(_ *providers.CreateRequest, c *Config) { c.Defaults.MachineType = "" }, "placement.machineType is required"},
		{"not a size slug", func(r *providers.CreateRequest, _ *Config) { r.Placement.MachineType = "Large Droplet" }, `"Large Droplet" is not a size slug`},
		{"not a region", func(r *providers.CreateRequest, _ *Config) { r.Placement.Zone = "europe-west1-b" }, `"europe-west1-b" is not a region slug`},
		{"not an image slug", func(r *providers.CreateRequest, _ *Config) { r.Placement.Image = "Debian 12" }, "is not an image slug"},
		{"no login for the bootstrap", func(r *providers.CreateRequest, _ *Config) { r.ProxyAuth, r.CloudInit = nil, nil }, "refusing to boot an open proxy"},
		{"a label that is no tag", func(r *providers.CreateRequest, _ *Config) {
			r.Labels = map[string]string{"app.kubernetes.io/name": "x"}
		}, "as tag"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := testRequest()
			p, srv := newTestProvider(t, func(c *Config) { tt.mutate(&req, c) })
			_, err := p.Create(ctx(t), req)
			if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want Permanent saying %q", err, tt.want)
			}
			if calls := srv.Ops(); len(calls) != 0 {
				t.Fatalf("a refused request reached the API: %v", calls)
			}
		})
	}
}

func TestGetFollowsTheDropletFromNewToActive(t *testing.T) {
	for _, tt := range []struct {
		name                  string
		status                string
		public, private, ipv6 string
		addressType           string
		wantState             providers.State
		wantIP                string
	}{
		{"new", doapi.StatusNew, "", "", "", "", providers.StateProvisioning, ""},
		{"active without a public address yet", doapi.StatusActive, "", "10.110.0.9", "", "", providers.StateProvisioning, ""},
		{"active with one", doapi.StatusActive, "198.51.100.9", "10.110.0.9", "2001:db8:1::9", "", providers.StateRunning, "198.51.100.9"},
		{"IPv6 only", doapi.StatusActive, "", "10.110.0.9", "2001:db8:1::9", "", providers.StateRunning, "2001:db8:1::9"},
		{"private address", doapi.StatusActive, "198.51.100.9", "10.110.0.9", "", AddressPrivate, providers.StateRunning, "10.110.0.9"},
		{"off", doapi.StatusOff, "198.51.100.9", "", "", "", providers.StateStopped, ""},
		{"a status DigitalOcean may add", "hibernating", "198.51.100.9", "", "", "", providers.StateStopped, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, func(c *Config) { c.AddressType = tt.addressType })
			inst, err := p.Create(ctx(t), testRequest())
			if err != nil {
				t.Fatal(err)
			}
			id := dropletID(t, inst.ProviderID)
			srv.SetStatus(id, tt.status)
			srv.SetAddresses(id, tt.public, tt.private, tt.ipv6)
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

func TestGetOfArchivedMissingOrForeignDropletIsNotFound(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	inst, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	srv.SetStatus(dropletID(t, inst.ProviderID), doapi.StatusArchive)
	stranger := srv.Put(doapi.Droplet{Name: "web-1"})
	for _, id := range []string{inst.ProviderID, formatProviderID(99999999), formatProviderID(stranger)} {
		if _, err := p.Get(ctx(t), id); !errors.Is(err, providers.ErrNotFound) {
			t.Errorf("Get(%s) err = %v, want NotFound", id, err)
		}
	}
}

func TestMalformedProviderIDIsPermanentAndCallsNothing(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	for _, id := range []string{"", "12345", "digitalocean://", "digitalocean://-1", "digitalocean://0", "digitalocean://012", "digitalocean://12/3", "aws:///eu-west-1b/i-0123456789abcdef0"} {
		if _, err := p.Get(ctx(t), id); !errors.Is(err, providers.ErrPermanent) {
			t.Errorf("Get(%q) err = %v, want Permanent", id, err)
		}
		if err := p.Delete(ctx(t), id); !errors.Is(err, providers.ErrPermanent) {
			t.Errorf("Delete(%q) err = %v, want Permanent", id, err)
		}
	}
	if calls := srv.Ops(); len(calls) != 0 {
		t.Fatalf("malformed IDs reached the API: %v", calls)
	}
}

func TestDeleteDestroysAndToleratesAGoneDroplet(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	inst, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx(t), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if n := len(srv.Droplets()); n != 0 {
		t.Fatalf("droplets after Delete = %d", n)
	}
	if _, err := p.Get(ctx(t), inst.ProviderID); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("Get once deleted: err = %v, want NotFound", err)
	}
	if err := p.Delete(ctx(t), inst.ProviderID); err != nil {
		t.Fatalf("deleting a droplet that is gone must succeed: %v", err)
	}
	if n := srv.CallCount(doapi.DeleteDroplet); n != 2 {
		t.Fatalf("deletes = %d, want 2", n)
	}
	srv.Fail(doapi.DeleteDroplet, doapi.Error{Status: 403, ID: "forbidden", Message: "You are not authorized to perform this operation"})
	if err := p.Delete(ctx(t), inst.ProviderID); !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "You are not authorized") {
		t.Fatalf("a refused Delete: err = %v, want Permanent with the cloud's message", err)
	}
}

func TestListByTagFollowsEveryPageAndSkipsStrangers(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	want := map[int]string{}
	for i, st := range []string{doapi.StatusNew, doapi.StatusActive, doapi.StatusOff, doapi.StatusActive, doapi.StatusActive} {
		uid := "uid-" + string(rune('a'+i))
		id := srv.Put(doapi.Droplet{Status: st, Region: []string{"ams3", "fra1", "nyc3"}[i%3], Name: "proxy-" + uid,
			Tags: []string{TagManaged, TagOwnerUIDPrefix + uid, TagInstallationPrefix + "cluster-" + uid}})
		want[id] = uid
	}
	srv.Put(doapi.Droplet{Status: doapi.StatusArchive, Tags: []string{TagManaged, TagOwnerUIDPrefix + "uid-gone"}})
	srv.Put(doapi.Droplet{Name: "web-1", Tags: []string{"web"}})
	srv.SetPageSize(2)
	got, err := p.ListByTag(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("ListByTag = %+v, want the %d managed live droplets", got, len(want))
	}
	for _, inst := range got {
		id, _ := parseProviderID(inst.ProviderID)
		if uid := want[id]; uid == "" || inst.OwnerUID != uid || inst.Installation != "cluster-"+uid || inst.CreatedAt.IsZero() || !slices.Equal(inst.Parts, []string{providers.PartVM}) {
			t.Errorf("%+v: want owner, installation, creation time and the vm part", inst)
		}
	}
	if n := srv.CallCount(doapi.ListDroplets); n != 3 {
		t.Fatalf("list pages = %d, want 3 (6 tagged droplets, 2 a page)", n)
	}
	for _, c := range srv.Calls() {
		if !strings.Contains(c.Query, "tag_name=proxyfleet&") && !strings.HasSuffix(c.Query, "tag_name=proxyfleet") {
			t.Fatalf("a page without the managed tag: %s", c.Query)
		}
	}
	// A page failing fails the whole list.
	srv.Fail(doapi.ListDroplets, doapi.Error{Status: 503, ID: "service_unavailable", Message: "Service Unavailable"})
	if got, err := p.ListByTag(ctx(t)); err == nil || got != nil {
		t.Fatalf("ListByTag with a failing page = %+v, %v; want an error and no partial list", got, err)
	}
}

// TestErrorsAreClassifiedAndTheSDKNeverRetries: every failure goes to the
// reconciler with its class and the cloud's words after exactly one
// request.
func TestErrorsAreClassifiedAndTheSDKNeverRetries(t *testing.T) {
	for _, tt := range []struct {
		err  doapi.Error
		want error
	}{
		{doapi.Quota, providers.ErrQuotaExceeded},
		{doapi.Error{Status: 422, ID: "unprocessable_entity", Message: "Size is not available in this region."}, providers.ErrQuotaExceeded},
		{doapi.Throttled, providers.ErrTransient},
		{doapi.Error{Status: 500, ID: "server_error", Message: "Server was unable to give you a response."}, providers.ErrTransient},
		{doapi.Error{Status: 503, ID: "service_unavailable", Message: "Service Unavailable"}, providers.ErrTransient},
		{doapi.Error{Status: 401, ID: "Unauthorized", Message: "Unable to authenticate you"}, providers.ErrPermanent},
		{doapi.Error{Status: 403, ID: "forbidden", Message: "You are not authorized to perform this operation"}, providers.ErrPermanent},
		{doapi.Error{Status: 422, ID: "unprocessable_entity", Message: "You specified an invalid image for Droplet creation."}, providers.ErrPermanent},
		{doapi.Error{Status: 422, ID: "unprocessable_entity", Message: "You specified an invalid size for Droplet creation."}, providers.ErrPermanent},
		{doapi.Error{Status: 422, ID: "unprocessable_entity", Message: "You specified an invalid region for Droplet creation."}, providers.ErrPermanent},
	} {
		t.Run(tt.err.Message, func(t *testing.T) {
			p, srv := newTestProvider(t, nil)
			srv.Fail(doapi.CreateDroplet, tt.err)
			_, err := p.Create(ctx(t), testRequest())
			if got := providers.Class(err); got != tt.want || !strings.Contains(err.Error(), tt.err.Message) || !strings.Contains(err.Error(), strconv.Itoa(tt.err.Status)) {
				t.Fatalf("Create: %v (class %v), want %v with the cloud's status and message", err, got, tt.want)
			}
			if n := srv.CallCount(doapi.CreateDroplet); n != 1 {
				t.Fatalf("creates = %d: the SDK retried instead of handing the error to the reconciler", n)
			}
			if len(srv.Droplets()) != 0 {
				t.Fatal("a refused create left a droplet")
			}
		})
	}
}

// TestTheCloudsOwnRefusalsAreClassified: the stand-in's own answers, not a
// queued failure: the droplet limit reached, and an image, size or
// region it does not know.
func TestTheCloudsOwnRefusalsAreClassified(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	srv.SetDropletLimit(1)
	srv.Put(doapi.Droplet{Name: "web-1"})
	if _, err := p.Create(ctx(t), testRequest()); providers.Class(err) != providers.ErrQuotaExceeded || !strings.Contains(err.Error(), "droplet limit") {
		t.Fatalf("at the droplet limit: %v, want QuotaExceeded with the cloud's words", err)
	}
	srv.SetDropletLimit(0)
	for _, tt := range []struct{ field, value, want string }{
		{"image", "debian-9-x64", "invalid image"}, {"size", "s-64vcpu-1tb", "invalid size"}, {"region", "xyz1", "invalid region"},
	} {
		req := testRequest()
		switch tt.field {
		case "image":
			req.Placement.Image = tt.value
		case "size":
			req.Placement.MachineType = tt.value
		case "region":
			req.Placement.Zone = tt.value
		}
		if _, err := p.Create(ctx(t), req); !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), tt.want) {
			t.Fatalf("unknown %s: %v, want Permanent with the cloud's message", tt.field, err)
		}
	}
	if n := len(srv.Droplets()); n != 1 {
		t.Fatalf("droplets = %d, want only the one put there", n)
	}
}

func TestThrottlingThenSuccess(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	inst, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	srv.Fail(doapi.GetDroplet, doapi.Throttled)
	if _, err := p.Get(ctx(t), inst.ProviderID); providers.Class(err) != providers.ErrTransient || !strings.Contains(err.Error(), "API Rate limit exceeded") {
		t.Fatalf("throttled Get: %v, want Transient", err)
	}
	if got, err := p.Get(ctx(t), inst.ProviderID); err != nil || got.State != providers.StateProvisioning {
		t.Fatalf("the reconciler's retry: %+v, %v", got, err)
	}
	if n := srv.CallCount(doapi.GetDroplet); n != 2 {
		t.Fatalf("gets = %d, want 2: one throttled, one retried by the caller", n)
	}
}

// TestBadTokenIsPermanentAndARotatedTokenIsReadAgain: a token DigitalOcean
// does not know is Permanent with the cloud's message, in Create and in
// Check; once the Secret's file holds a good token, the next call uses it
// without a new provider.
func TestBadTokenIsPermanentAndARotatedTokenIsReadAgain(t *testing.T) {
	var path string
	p, srv := newTestProvider(t, func(c *Config) { path = c.TokenFile })
	writeToken(t, path, "dop_v1_revoked")
	_, err := p.Create(ctx(t), testRequest())
	if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "Unable to authenticate you") {
		t.Fatalf("Create with a bad token: %v, want Permanent with the cloud's message", err)
	}
	if strings.Contains(err.Error(), "dop_v1_revoked") {
		t.Fatal("the error carries the token")
	}
	st := p.Check(ctx(t))
	if len(st) != 1 || st[0].Ready || st[0].Reason != "Unauthorized" || !strings.Contains(st[0].Message, "Unable to authenticate you") {
		t.Fatalf("Check with a bad token = %+v", st)
	}
	writeToken(t, path, doapi.DefaultToken)
	if _, err := p.Create(ctx(t), testRequest()); err != nil {
		t.Fatalf("Create after the token was rotated: %v", err)
	}
	if st := p.Check(ctx(t)); !st[0].Ready {
		t.Fatalf("Check after the token was rotated = %+v", st)
	}
	var sawWrong, sawRight bool
	for _, c := range srv.Calls() {
		sawWrong = sawWrong || c.Authorization == "Bearer dop_v1_revoked"
		sawRight = sawRight || c.Authorization == "Bearer "+doapi.DefaultToken
	}
	if !sawWrong || !sawRight {
		t.Fatal("the token file was not read on every request")
	}
}

func TestMissingTokenFileIsTransientAndSendsNothing(t *testing.T) {
	var path string
	p, srv := newTestProvider(t, func(c *Config) { path = c.TokenFile })
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
	if n := len(srv.Calls()); n != 0 {
		t.Fatalf("%d requests went out without a token", n)
	}
}

func TestCheckListsOneDropletOnAFreshConnection(t *testing.T) {
	for _, tt := range []struct {
		name       string
		fail       *doapi.Error
		wantReady  bool
		wantReason string
	}{
		{"a working token", nil, true, "OK"},
		{"no read scope", &doapi.Error{Status: 403, ID: "forbidden", Message: "You are not authorized to perform this operation"}, false, "Forbidden"},
		{"throttled", &doapi.Throttled, false, "Throttled"},
		{"down", &doapi.Error{Status: 500, ID: "server_error", Message: "Server was unable to give you a response."}, false, "Unavailable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, nil)
			if tt.fail != nil {
				srv.Fail(doapi.ListDroplets, *tt.fail)
			}
			got := p.Check(ctx(t))
			if len(got) != 1 || got[0].Target != testRegion || got[0].Ready != tt.wantReady || got[0].Reason != tt.wantReason {
				t.Fatalf("Check = %+v, want target %s ready=%v %s", got, testRegion, tt.wantReady, tt.wantReason)
			}
			calls := srv.Calls()
			if len(calls) != 1 || !strings.Contains(calls[0].Query, "per_page=1") || !strings.Contains(calls[0].Query, "tag_name=proxyfleet") {
				t.Fatalf("calls = %+v, want one page of 1 managed droplet", calls)
			}
		})
	}
	p, srv := newTestProvider(t, nil)
	srv.Close()
	if got := p.Check(ctx(t)); got[0].Ready || got[0].Reason != "Unreachable" {
		t.Fatalf("Check of a closed endpoint = %+v, want Unreachable", got)
	}
}

func TestNetworkErrorsAreTransient(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	srv.Close()
	if _, err := p.Get(ctx(t), formatProviderID(12345)); providers.Class(err) != providers.ErrTransient {
		t.Fatalf("err = %v, want Transient", err)
	}
}
