package aws

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/internal/testkit/ec2api"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
)

const (
	testRegion = "eu-west-1"
	testZone   = "eu-west-1b"
	testUID    = "0b6f2a3c-1111-4222-8333-444455556666"
	testSecret = ec2api.DefaultSecretAccessKey
)

// keyFiles writes an access key's two files, as a mounted Secret holds
// them, and returns their Credentials.
func keyFiles(t *testing.T, id string) *Credentials {
	t.Helper()
	dir := t.TempDir()
	c := &Credentials{AccessKeyIDFile: filepath.Join(dir, "access-key-id"), SecretAccessKeyFile: filepath.Join(dir, "secret-access-key")}
	writeKey(t, c, id)
	return c
}

func writeKey(t *testing.T, c *Credentials, id string) {
	t.Helper()
	if err := os.WriteFile(c.AccessKeyIDFile, []byte(id+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.SecretAccessKeyFile, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// newTestProvider returns the provider on the real EC2 client, pointed at
// a fresh in-test EC2 API and signing with a static key from files.
func newTestProvider(t *testing.T, mutate func(*Config)) (*Provider, *ec2api.Server) {
	t.Helper()
	srv := ec2api.Start(t, testRegion)
	cfg := Config{
		Region:       testRegion,
		Entry:        "aws-eu",
		Defaults:     providers.Placement{Zone: testZone, MachineType: "t3.micro"},
		SourceRanges: []string{"203.0.113.0/24", "2001:db8:1::/48"},
		Endpoint:     srv.URL,
		Credentials:  keyFiles(t, ec2api.DefaultAccessKeyID),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checkSigned(t, srv) })
	return p, srv
}

// checkSigned fails the test when a request reached the API without a
// SigV4 Authorization header naming the key, the region and ec2.
func checkSigned(t *testing.T, srv *ec2api.Server) {
	for _, c := range srv.Calls() {
		want := "AWS4-HMAC-SHA256 Credential=" + ec2api.DefaultAccessKeyID + "/"
		if !strings.HasPrefix(c.Authorization, want) && !strings.HasPrefix(c.Authorization, "AWS4-HMAC-SHA256 Credential=AKIDWRONG") {
			t.Errorf("%s was sent with Authorization %q, want SigV4", c.Action, c.Authorization)
		}
		if !strings.Contains(c.Authorization, "/"+testRegion+"/ec2/aws4_request") || !strings.Contains(c.Authorization, "Signature=") {
			t.Errorf("%s: Authorization %q does not scope the region and ec2", c.Action, c.Authorization)
		}
	}
}

func testRequest() providers.CreateRequest {
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

func instanceID(t *testing.T, providerID string) string {
	t.Helper()
	_, id, err := parseProviderID(providerID)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestCreateLaunchesOneTaggedInstanceBootingTheBootstrap(t *testing.T) {
	p, srv := newTestProvider(t, func(c *Config) {
		c.Tags = map[string]string{"team": "crawl", TagOwnerUID: "forged", TagInstallation: "forged"}
	})
	req := testRequest()
	req.Labels = map[string]string{"pool": "eu"}
	inst, err := p.Create(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	live := srv.Live()
	if len(live) != 1 {
		t.Fatalf("instances = %+v, want one", live)
	}
	got := live[0]
	if want := "aws:///" + testZone + "/" + got.ID; inst.ProviderID != want || inst.State != providers.StateProvisioning || inst.OwnerUID != testUID || inst.Installation != "cluster-a" || inst.Name != req.Name {
		t.Fatalf("Create = %+v, want %s Provisioning, owned, named", inst, want)
	}
	if got.ClientToken != testUID {
		t.Errorf("client token = %q, want the Proxy UID", got.ClientToken)
	}
	wantTags := map[string]string{TagManagedBy: ManagedBy, TagOwnerUID: testUID, TagInstallation: "cluster-a", TagOwner: "crawl/eu-1", TagName: req.Name, "team": "crawl", "pool": "eu"}
	for name, tags := range map[string]map[string]string{"instance": got.Tags, "volume": got.VolumeTags, "network interface": got.NICTags} {
		if len(tags) != len(wantTags) {
			t.Errorf("%s tags = %v, want %v", name, tags, wantTags)
		}
		for k, v := range wantTags {
			if tags[k] != v {
				t.Errorf("%s tag %s = %q, want %q", name, k, tags[k], v)
			}
		}
	}
	if got.RootDevice != "/dev/xvda" || got.RootDeleteOnTermination != "true" {
		t.Errorf("root volume mapping %q delete-on-termination %q: want the AMI's root device deleted with the instance", got.RootDevice, got.RootDeleteOnTermination)
	}
	if got.Type != "t3.micro" || got.Zone != testZone || got.AssociatePublicIP != "true" || got.IPv6AddressCount != 0 {
		t.Errorf("launched %s in %s, public address %q, IPv6 %d", got.Type, got.Zone, got.AssociatePublicIP, got.IPv6AddressCount)
	}
	// The default image: Debian's newest x86-64 Debian 12, never a
	// look-alike of another owner, even a newer one.
	if got.ImageID != ec2api.DebianAMD64 {
		t.Errorf("image = %s, want Debian's newest debian-12-amd64", got.ImageID)
	}
	// The user-data is the bootstrap with the Proxy's own login.
	var cc struct {
		WriteFiles []struct{ Path, Content string } `json:"write_files"`
	}
	if err := yaml.Unmarshal([]byte(got.UserData), &cc); err != nil || !strings.HasPrefix(got.UserData, "#cloud-config\n") {
		t.Fatalf("user-data is not a cloud-config (%v):\n%s", err, got.UserData)
	}
	var htpasswd string
	for _, f := range cc.WriteFiles {
		if f.Path == bootstrap.PasswordFilePath {
			htpasswd = f.Content
		}
	}
	if u, _, _ := strings.Cut(htpasswd, ":"); u != "proxyfleet" || strings.Contains(got.UserData, req.ProxyAuth.Password) {
		t.Fatalf("password file for %q, want proxyfleet's hash and never the password", u)
	}
	// Launched in the managed group.
	groups := srv.SecurityGroups()
	if len(groups) != 1 || !slices.Equal(got.SecurityGroups, []string{groups[0].ID}) || groups[0].Name != "proxyfleet-aws-eu-cluster-a" {
		t.Fatalf("instance groups %v, groups %+v: want the one managed group", got.SecurityGroups, groups)
	}
	if want := []string{ec2api.DescribeSecurityGroups, ec2api.CreateSecurityGroup, ec2api.AuthorizeSecurityGroupIngress, ec2api.DescribeImages, ec2api.RunInstances}; !slices.Equal(srv.Actions(), want) {
		t.Fatalf("calls = %v, want %v (no waiting for the instance)", srv.Actions(), want)
	}
	if run := srv.Calls()[4].Form; run.Get("MetadataOptions.HttpTokens") != "required" || run.Get("InstanceInitiatedShutdownBehavior") != "terminate" {
		t.Errorf("RunInstances must demand IMDSv2 and terminate on shutdown: %v", run)
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
	if ud := srv.Live()[0].UserData; ud != string(req.CloudInit) {
		t.Fatalf("user-data = %q, want the Proxy's own cloud-init", ud)
	}
}

func TestSecurityGroupAdmitsTheProxyPortFromSourceRangesOnly(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	if _, err := p.Create(ctx(t), testRequest()); err != nil {
		t.Fatal(err)
	}
	g := srv.SecurityGroups()[0]
	want := []ec2api.Permission{{Protocol: "tcp", FromPort: 3128, ToPort: 3128, CIDRs: []string{"203.0.113.0/24"}, IPv6CIDRs: []string{"2001:db8:1::/48"}}}
	if !equalPerms(g.Ingress, want) {
		t.Fatalf("ingress = %+v, want only 3128 from the source ranges (no SSH)", g.Ingress)
	}
	if g.Tags[TagManagedBy] != ManagedBy || g.Tags[TagInstallation] != "cluster-a" {
		t.Fatalf("group tags = %v", g.Tags)
	}

	// Rules added by hand are revoked by the next Create; another Proxy's
	// port joins the first's.
	gid := g.ID
	g.Ingress[0].CIDRs = append(g.Ingress[0].CIDRs, "198.51.100.0/24")
	srv.PutSecurityGroup(ec2api.SecurityGroup{ID: gid, Name: g.Name, Description: g.Description, VpcID: g.VpcID, Tags: g.Tags, Ingress: append(g.Ingress,
		ec2api.Permission{Protocol: "tcp", FromPort: 22, ToPort: 22, CIDRs: []string{"0.0.0.0/0"}},
		ec2api.Permission{Protocol: "udp", FromPort: 53, ToPort: 53, CIDRs: []string{"203.0.113.0/24"}},
	)})
	other := testRequest()
	other.OwnerUID, other.Name, other.Port = "7c1d0000-2222-4333-8444-555566667777", providers.NameFromUID("7c1d0000-2222-4333-8444-555566667777"), 8080
	if _, err := p.Create(ctx(t), other); err != nil {
		t.Fatal(err)
	}
	want = append(want, ec2api.Permission{Protocol: "tcp", FromPort: 8080, ToPort: 8080, CIDRs: []string{"203.0.113.0/24"}, IPv6CIDRs: []string{"2001:db8:1::/48"}})
	if got := srv.SecurityGroups(); len(got) != 1 || !equalPerms(got[0].Ingress, want) {
		t.Fatalf("ingress = %+v, want %+v", got[0].Ingress, want)
	}

	// SSH only from sshSourceRanges, and only when they are configured.
	p2, srv2 := newTestProvider(t, func(c *Config) { c.SSHSourceRanges = []string{"192.0.2.10/32"} })
	if _, err := p2.Create(ctx(t), testRequest()); err != nil {
		t.Fatal(err)
	}
	want = []ec2api.Permission{
		{Protocol: "tcp", FromPort: 3128, ToPort: 3128, CIDRs: []string{"203.0.113.0/24"}, IPv6CIDRs: []string{"2001:db8:1::/48"}},
		{Protocol: "tcp", FromPort: 22, ToPort: 22, CIDRs: []string{"192.0.2.10/32"}},
	}
	if got := srv2.SecurityGroups()[0].Ingress; !equalPerms(got, want) {
		t.Fatalf("ingress with sshSourceRanges = %+v, want %+v", got, want)
	}
}

func equalPerms(a, b []ec2api.Permission) bool {
	norm := func(ps []ec2api.Permission) []string {
		var out []string
		for _, p := range ps {
			for _, c := range append(slices.Clone(p.CIDRs), p.IPv6CIDRs...) {
				out = append(out, p.Protocol+"/"+strconv.Itoa(p.FromPort)+"-"+strconv.Itoa(p.ToPort)+"/"+c)
			}
			for _, g := range p.Groups {
				out = append(out, p.Protocol+"/"+strconv.Itoa(p.FromPort)+"-"+strconv.Itoa(p.ToPort)+"/"+g)
			}
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(norm(a), norm(b))
}

func TestOperatorsSecurityGroupsAreAttachedAndNeverChanged(t *testing.T) {
	p, srv := newTestProvider(t, func(c *Config) { c.SourceRanges, c.SecurityGroupIDs = nil, []string{"sg-0aaaaaaaaaaaaaaa1"} })
	srv.PutSecurityGroup(ec2api.SecurityGroup{ID: "sg-0aaaaaaaaaaaaaaa1", Name: "mine", Description: "mine"})
	if _, err := p.Create(ctx(t), testRequest()); err != nil {
		t.Fatal(err)
	}
	if got := srv.Live()[0].SecurityGroups; !slices.Equal(got, []string{"sg-0aaaaaaaaaaaaaaa1"}) {
		t.Fatalf("groups = %v", got)
	}
	if want := []string{ec2api.DescribeImages, ec2api.RunInstances}; !slices.Equal(srv.Actions(), want) {
		t.Fatalf("calls = %v, want %v: the operator's group is not touched", srv.Actions(), want)
	}
}

func TestCreateIsIdempotentByClientToken(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	first, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	id := instanceID(t, first.ProviderID)
	srv.SetState(id, ec2api.StateRunning)
	srv.SetAddresses(id, "10.0.1.7", "198.51.100.7", "")
	again, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if again.ProviderID != first.ProviderID || again.State != providers.StateRunning || again.IP != "198.51.100.7" {
		t.Fatalf("retried Create = %+v, want the running instance %s", again, first.ProviderID)
	}
	if n := len(srv.Instances()); n != 1 {
		t.Fatalf("instances = %d, want 1", n)
	}
}

// TestCreateWhoseAnswerIsLostMakesOneInstance: EC2 made the instance but
// its answer was a 500, or never came. The Create fails Transient; the
// reconciler's retry sends the same client token and gets that instance.
func TestCreateWhoseAnswerIsLostMakesOneInstance(t *testing.T) {
	for _, tt := range []struct {
		name string
		lose func(*ec2api.Server)
		hang bool
	}{
		{"answered 500 after the launch", func(s *ec2api.Server) {
			s.FailAfter(ec2api.RunInstances, ec2api.Error{Status: 500, Code: "InternalError", Message: "An internal error has occurred"})
		}, false},
		{"the answer never arrives", func(s *ec2api.Server) { s.HangAfter(ec2api.RunInstances, 1) }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, nil)
			// The security group and image are settled first, so the
			// lost call is the launch itself.
			if _, _, err := p.securityGroups(ctx(t), testRequest()); err != nil {
				t.Fatal(err)
			}
			tt.lose(srv)
			c := ctx(t)
			if tt.hang {
				// The client gives up waiting once EC2 has the launch
				// (a fixed timeout could run out before the request is
				// even sent on a busy machine).
				var cancel context.CancelFunc
				c, cancel = context.WithCancel(c)
				defer cancel()
				go func() {
					for srv.CallCount(ec2api.RunInstances) == 0 && c.Err() == nil {
						time.Sleep(10 * time.Millisecond)
					}
					cancel()
				}()
			}
			_, err := p.Create(c, testRequest())
			if providers.Class(err) != providers.ErrTransient {
				t.Fatalf("lost answer: err = %v, want Transient", err)
			}
			if n := len(srv.Instances()); n != 1 {
				t.Fatalf("instances after the lost answer = %d, want the 1 EC2 made", n)
			}
			inst, err := p.Create(ctx(t), testRequest())
			if err != nil {
				t.Fatalf("retried Create: %v", err)
			}
			all := srv.Instances()
			if len(all) != 1 || inst.ProviderID != formatProviderID(testZone, all[0].ID) {
				t.Fatalf("instances = %+v, Create = %+v: want exactly the one instance", all, inst)
			}
			if n := srv.CallCount(ec2api.RunInstances); n != 2 {
				t.Fatalf("RunInstances calls = %d, want 2 (no SDK retry)", n)
			}
		})
	}
}

// TestCreateAfterTerminationUsesTheNextToken: a Proxy whose instance was
// terminated (replaced because it stopped, or its spec changed) gets a new
// one under the next client token, and that Create is idempotent too.
func TestCreateAfterTerminationUsesTheNextToken(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	first, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx(t), first.ProviderID); err != nil {
		t.Fatal(err)
	}
	srv.SetState(instanceID(t, first.ProviderID), ec2api.StateTerminated)
	second, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	third, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if second.ProviderID == first.ProviderID || third.ProviderID != second.ProviderID {
		t.Fatalf("first %s, second %s, third %s: want a new instance, then the same", first.ProviderID, second.ProviderID, third.ProviderID)
	}
	live := srv.Live()
	if len(live) != 1 || live[0].ClientToken != testUID+"-1" {
		t.Fatalf("live instances = %+v, want one under token %s-1", live, testUID)
	}
	// The same holds while the old instance is still shutting down.
	if err := p.Delete(ctx(t), second.ProviderID); err != nil {
		t.Fatal(err)
	}
	fourth, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if live := srv.Live(); fourth.ProviderID == second.ProviderID || len(live) != 2 || live[1].ClientToken != testUID+"-2" {
		t.Fatalf("Create while the old instance shuts down = %+v, live %+v", fourth, live)
	}
}

func TestCreateRefusesBadPlacementWithoutCalling(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mutate func(*providers.CreateRequest, *Config)
		want   string
	}{
		{"no instance type", func(_ *providers.CreateRequest, c *Config) { c.Defaults.MachineType = "" }, "placement.machineType is required"},
		{"not an instance type", func(r *providers.CreateRequest, _ *Config) { r.Placement.MachineType = "large" }, `"large" is not an instance type`},
		{"a zone of another region", func(r *providers.CreateRequest, _ *Config) { r.Placement.Zone = "us-east-1a" }, "not an availability zone of eu-west-1"},
		{"no login for the bootstrap", func(r *providers.CreateRequest, _ *Config) { r.ProxyAuth = nil }, "refusing to boot an open proxy"},
		{"a reserved tag", func(r *providers.CreateRequest, _ *Config) { r.Labels = map[string]string{"aws:x": "y"} }, "reserved by AWS"},
		{"bad image", func(r *providers.CreateRequest, _ *Config) { r.Placement.Image = "debian 12" }, "neither an AMI ID"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := testRequest()
			p, srv := newTestProvider(t, func(c *Config) { tt.mutate(&req, c) })
			_, err := p.Create(ctx(t), req)
			if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want Permanent saying %q", err, tt.want)
			}
			if calls := srv.Actions(); len(calls) != 0 {
				t.Fatalf("a refused request reached the API: %v", calls)
			}
		})
	}
}

func TestImageByIDOrByNameAndOwner(t *testing.T) {
	t.Run("an AMI ID is used as given", func(t *testing.T) {
		p, srv := newTestProvider(t, func(c *Config) { c.Defaults.Image = ec2api.DebianAMD64Old })
		if _, err := p.Create(ctx(t), testRequest()); err != nil {
			t.Fatal(err)
		}
		var described []string
		for _, c := range srv.Calls() {
			if c.Action == ec2api.DescribeImages {
				described = append(described, c.Form.Get("ImageId.1")+"/"+c.Form.Get("Owner.1"))
			}
		}
		if !slices.Equal(described, []string{ec2api.DebianAMD64Old + "/"}) || srv.Live()[0].ImageID != ec2api.DebianAMD64Old {
			t.Fatalf("images described %v, image %s: want the AMI described by ID (for its root device) and launched", described, srv.Live()[0].ImageID)
		}
	})
	t.Run("an AMI ID that does not exist is permanent and launches nothing", func(t *testing.T) {
		p, srv := newTestProvider(t, func(c *Config) { c.Defaults.Image = "ami-0ffffffffffffffff" })
		_, err := p.Create(ctx(t), testRequest())
		if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "InvalidAMIID.NotFound") {
			t.Fatalf("err = %v, want Permanent with EC2's InvalidAMIID.NotFound", err)
		}
		if srv.CallCount(ec2api.RunInstances) != 0 {
			t.Fatal("launched an image that does not exist")
		}
	})
	t.Run("a name filter under the configured owners", func(t *testing.T) {
		p, srv := newTestProvider(t, func(c *Config) { c.ImageOwners = []string{"999999999999"} })
		req := testRequest()
		req.Placement.Image = "debian-12-*"
		if _, err := p.Create(ctx(t), req); err != nil {
			t.Fatal(err)
		}
		if got := srv.Live()[0].ImageID; got != ec2api.LookalikeAMD64 {
			t.Fatalf("image = %s, want the owner's", got)
		}
	})
	t.Run("no match is permanent", func(t *testing.T) {
		p, srv := newTestProvider(t, func(c *Config) { c.Defaults.Image = "ubuntu-*" })
		_, err := p.Create(ctx(t), testRequest())
		if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), `no available image named "ubuntu-*" owned by 136693071363`) {
			t.Fatalf("err = %v", err)
		}
		if srv.CallCount(ec2api.RunInstances) != 0 {
			t.Fatal("launched without an image")
		}
	})
}

func TestGetFollowsTheInstanceFromPendingToRunning(t *testing.T) {
	for _, tt := range []struct {
		name              string
		state             string
		private, pub, ip6 string
		addressType       string
		ipv6              bool
		wantState         providers.State
		wantIP            string
	}{
		{"pending", ec2api.StatePending, "10.0.1.9", "", "", "", false, providers.StateProvisioning, ""},
		{"running without a public address yet", ec2api.StateRunning, "10.0.1.9", "", "", "", false, providers.StateProvisioning, ""},
		{"running with one", ec2api.StateRunning, "10.0.1.9", "198.51.100.9", "2001:db8:1::9", "", true, providers.StateRunning, "198.51.100.9"},
		{"IPv6 only", ec2api.StateRunning, "10.0.1.9", "", "2001:db8:1::9", "", true, providers.StateRunning, "2001:db8:1::9"},
		{"private address", ec2api.StateRunning, "10.0.1.9", "198.51.100.9", "", AddressPrivate, false, providers.StateRunning, "10.0.1.9"},
		{"stopping", ec2api.StateStopping, "10.0.1.9", "198.51.100.9", "", "", false, providers.StateStopped, ""},
		{"stopped", ec2api.StateStopped, "10.0.1.9", "", "", "", false, providers.StateStopped, ""},
		{"shutting down", ec2api.StateShuttingDown, "10.0.1.9", "", "", "", false, providers.StateTerminated, ""},
		{"a state EC2 may add", "hibernating", "10.0.1.9", "198.51.100.9", "", "", false, providers.StateStopped, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, func(c *Config) { c.AddressType, c.IPv6 = tt.addressType, tt.ipv6 })
			inst, err := p.Create(ctx(t), testRequest())
			if err != nil {
				t.Fatal(err)
			}
			id := instanceID(t, inst.ProviderID)
			if tt.ipv6 != (srv.Live()[0].IPv6AddressCount == 1) || (tt.addressType == AddressPrivate) != (srv.Live()[0].AssociatePublicIP == "") {
				t.Fatalf("launched with IPv6 count %d, public %q", srv.Live()[0].IPv6AddressCount, srv.Live()[0].AssociatePublicIP)
			}
			srv.SetState(id, tt.state)
			srv.SetAddresses(id, tt.private, tt.pub, tt.ip6)
			got, err := p.Get(ctx(t), inst.ProviderID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != tt.wantState || got.IP != tt.wantIP || got.OwnerUID != testUID || got.Installation != "cluster-a" || got.CreatedAt.IsZero() || got.ProviderID != inst.ProviderID {
				t.Fatalf("Get = %+v, want %s at %q, owned, with its launch time", got, tt.wantState, tt.wantIP)
			}
		})
	}
}

func TestGetOfTerminatedMissingOrForeignInstanceIsNotFound(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	inst, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	srv.SetState(instanceID(t, inst.ProviderID), ec2api.StateTerminated)
	stranger := srv.Put(ec2api.Instance{Zone: testZone, Tags: map[string]string{"Name": "web-1"}})
	for _, id := range []string{inst.ProviderID, formatProviderID(testZone, "i-0123456789abcdef0"), formatProviderID(testZone, stranger)} {
		if _, err := p.Get(ctx(t), id); !errors.Is(err, providers.ErrNotFound) {
			t.Errorf("Get(%s) err = %v, want NotFound", id, err)
		}
	}
}

func TestMalformedProviderIDIsPermanentAndCallsNothing(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	for _, id := range []string{"", "i-0123456789abcdef0", "aws:///i-0123456789abcdef0", "aws://eu-west-1b/i-0123456789abcdef0",
		"aws:///eu-west-1b/", "aws:///eu-west-1b/i-XYZ", "aws:///eu-west-1b/i-0123456789abcdef0/x", "zones/eu-west-1b/instances/proxy-abc"} {
		if _, err := p.Get(ctx(t), id); !errors.Is(err, providers.ErrPermanent) {
			t.Errorf("Get(%q) err = %v, want Permanent", id, err)
		}
		if err := p.Delete(ctx(t), id); !errors.Is(err, providers.ErrPermanent) {
			t.Errorf("Delete(%q) err = %v, want Permanent", id, err)
		}
	}
	if calls := srv.Actions(); len(calls) != 0 {
		t.Fatalf("malformed IDs reached the API: %v", calls)
	}
}

func TestDeleteTerminatesAndToleratesAGoneInstance(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	inst, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx(t), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Get(ctx(t), inst.ProviderID); err != nil || got.State != providers.StateTerminated {
		t.Fatalf("Get right after Delete = %+v, %v; want Terminated (shutting down)", got, err)
	}
	if _, err := p.Get(ctx(t), inst.ProviderID); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("Get once terminated: err = %v, want NotFound", err)
	}
	if err := p.Delete(ctx(t), inst.ProviderID); err != nil {
		t.Fatalf("deleting a terminated instance must succeed: %v", err)
	}
	if err := p.Delete(ctx(t), formatProviderID(testZone, "i-0123456789abcdef0")); err != nil {
		t.Fatalf("deleting an instance EC2 does not know must succeed: %v", err)
	}
	if n := srv.CallCount(ec2api.TerminateInstances); n != 3 {
		t.Fatalf("TerminateInstances = %d calls, want 3", n)
	}
	srv.Fail(ec2api.TerminateInstances, ec2api.Error{Status: 403, Code: "UnauthorizedOperation", Message: "You are not authorized to perform this operation."})
	if err := p.Delete(ctx(t), inst.ProviderID); !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "You are not authorized") {
		t.Fatalf("a refused Delete: err = %v, want Permanent with the cloud's message", err)
	}
}

func TestListByTagFollowsEveryPageAndSkipsStrangersAndTerminated(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	want := map[string]string{}
	for i, st := range []string{ec2api.StatePending, ec2api.StateRunning, ec2api.StateStopped, ec2api.StateShuttingDown, ec2api.StateRunning} {
		uid := "uid-" + string(rune('a'+i))
		id := srv.Put(ec2api.Instance{State: st, Zone: []string{"eu-west-1a", "eu-west-1b", "eu-west-1c"}[i%3],
			Tags: map[string]string{TagManagedBy: ManagedBy, TagOwnerUID: uid, TagInstallation: "cluster-" + uid, TagName: "proxy-" + uid}})
		want[id] = uid
	}
	srv.Put(ec2api.Instance{State: ec2api.StateTerminated, Tags: map[string]string{TagManagedBy: ManagedBy, TagOwnerUID: "uid-gone"}})
	srv.Put(ec2api.Instance{Tags: map[string]string{"Name": "web-1"}})
	srv.SetPageSize(2)
	got, err := p.ListByTag(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("ListByTag = %+v, want the %d managed live instances", got, len(want))
	}
	for _, inst := range got {
		_, id, _ := parseProviderID(inst.ProviderID)
		if uid := want[id]; uid == "" || inst.OwnerUID != uid || inst.Installation != "cluster-"+uid || inst.CreatedAt.IsZero() || !slices.Equal(inst.Parts, []string{providers.PartVM}) {
			t.Errorf("%+v: want owner, installation, launch time and the vm part", inst)
		}
	}
	if n := srv.CallCount(ec2api.DescribeInstances); n != 3 {
		t.Fatalf("DescribeInstances = %d pages, want 3 (5 instances, 2 a page)", n)
	}
	for _, c := range srv.Calls() {
		if c.Form.Get("Filter.1.Name") != "tag:"+TagManagedBy || c.Form.Get("Filter.1.Value.1") != ManagedBy {
			t.Fatalf("a page without the managed filter: %v", c.Form)
		}
	}

	// A page failing fails the whole list.
	srv.Fail(ec2api.DescribeInstances, ec2api.Error{Status: 503, Code: "Unavailable", Message: "The service is unavailable"})
	if got, err := p.ListByTag(ctx(t)); err == nil || got != nil {
		t.Fatalf("ListByTag with a failing page = %+v, %v; want an error and no partial list", got, err)
	}
}

// TestErrorsAreClassifiedAndTheSDKNeverRetries: every failure goes to the
// reconciler with its class and the cloud's words after exactly one
// request; the SDK's own retry loop would have sent more.
func TestErrorsAreClassifiedAndTheSDKNeverRetries(t *testing.T) {
	for _, tt := range []struct {
		err  ec2api.Error
		want error
	}{
		{ec2api.Error{Status: 400, Code: "InstanceLimitExceeded", Message: "You have requested more instances (21) than your current instance limit of 20 allows"}, providers.ErrQuotaExceeded},
		{ec2api.Error{Status: 400, Code: "VcpuLimitExceeded", Message: "You have requested more vCPU capacity than your current vCPU limit of 32 allows"}, providers.ErrQuotaExceeded},
		{ec2api.Error{Status: 500, Code: "InsufficientInstanceCapacity", Message: "We currently do not have sufficient t3.micro capacity in the Availability Zone you requested"}, providers.ErrQuotaExceeded},
		{ec2api.Error{Status: 503, Code: "RequestLimitExceeded", Message: "Request limit exceeded."}, providers.ErrTransient},
		{ec2api.Error{Status: 500, Code: "InternalError", Message: "An internal error has occurred"}, providers.ErrTransient},
		{ec2api.Error{Status: 503, Code: "Unavailable", Message: "The server is overloaded"}, providers.ErrTransient},
		{ec2api.Error{Status: 502, Code: "SomethingNew", Message: "bad gateway"}, providers.ErrTransient},
		{ec2api.Error{Status: 401, Code: "AuthFailure", Message: "AWS was not able to validate the provided access credentials"}, providers.ErrPermanent},
		{ec2api.Error{Status: 403, Code: "UnauthorizedOperation", Message: "You are not authorized to perform this operation."}, providers.ErrPermanent},
		{ec2api.Error{Status: 400, Code: "InvalidAMIID.NotFound", Message: "The image id '[ami-0de12a00000000002]' does not exist"}, providers.ErrPermanent},
		{ec2api.Error{Status: 400, Code: "InvalidParameterValue", Message: "Invalid value 't9.huge' for InstanceType."}, providers.ErrPermanent},
		{ec2api.Error{Status: 400, Code: "OptInRequired", Message: "You are not subscribed to this service."}, providers.ErrPermanent},
	} {
		t.Run(tt.err.Code, func(t *testing.T) {
			p, srv := newTestProvider(t, nil)
			srv.Fail(ec2api.RunInstances, tt.err)
			_, err := p.Create(ctx(t), testRequest())
			if got := providers.Class(err); got != tt.want || !strings.Contains(err.Error(), tt.err.Message) || !strings.Contains(err.Error(), tt.err.Code) {
				t.Fatalf("Create: %v (class %v), want %v with the cloud's code and message", err, got, tt.want)
			}
			if n := srv.CallCount(ec2api.RunInstances); n != 1 {
				t.Fatalf("RunInstances = %d requests: the SDK retried instead of handing the error to the reconciler", n)
			}
			if len(srv.Live()) != 0 {
				t.Fatal("a refused launch left an instance")
			}
		})
	}
}

func TestThrottlingThenSuccess(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	srv.Fail(ec2api.DescribeInstances, ec2api.Error{Status: 503, Code: "RequestLimitExceeded", Message: "Request limit exceeded."})
	inst, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx(t), inst.ProviderID); providers.Class(err) != providers.ErrTransient {
		t.Fatalf("throttled Get: %v, want Transient", err)
	}
	if got, err := p.Get(ctx(t), inst.ProviderID); err != nil || got.State != providers.StateProvisioning {
		t.Fatalf("the reconciler's retry: %+v, %v", got, err)
	}
	if n := srv.CallCount(ec2api.DescribeInstances); n != 2 {
		t.Fatalf("DescribeInstances = %d, want 2: one throttled, one retried by the caller", n)
	}
}

// TestBadCredentialsArePermanentAndARotatedKeyIsReadAgain: a key EC2 does
// not know is Permanent with the cloud's message, in Create and in Check;
// once the Secret's files hold a good key, the next call uses it without a
// new provider.
func TestBadCredentialsArePermanentAndARotatedKeyIsReadAgain(t *testing.T) {
	var creds *Credentials
	p, srv := newTestProvider(t, func(c *Config) { creds = c.Credentials })
	writeKey(t, creds, "AKIDWRONG00000000000")
	_, err := p.Create(ctx(t), testRequest())
	if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "AWS was not able to validate the provided access credentials") {
		t.Fatalf("Create with a bad key: %v, want Permanent with the cloud's message", err)
	}
	if strings.Contains(err.Error(), testSecret) {
		t.Fatal("the error carries the secret key")
	}
	st := p.Check(ctx(t))
	if len(st) != 1 || st[0].Ready || st[0].Reason != "Unauthorized" || !strings.Contains(st[0].Message, "AWS was not able to validate") {
		t.Fatalf("Check with a bad key = %+v", st)
	}
	writeKey(t, creds, ec2api.DefaultAccessKeyID)
	if _, err := p.Create(ctx(t), testRequest()); err != nil {
		t.Fatalf("Create after the key was rotated: %v", err)
	}
	if st := p.Check(ctx(t)); !st[0].Ready {
		t.Fatalf("Check after the key was rotated = %+v", st)
	}
	var sawWrong, sawRight bool
	for _, c := range srv.Calls() {
		sawWrong = sawWrong || strings.Contains(c.Authorization, "Credential=AKIDWRONG00000000000/")
		sawRight = sawRight || strings.Contains(c.Authorization, "Credential="+ec2api.DefaultAccessKeyID+"/")
	}
	if !sawWrong || !sawRight {
		t.Fatal("the key files were not read on every request")
	}
}

func TestMissingKeyFileIsTransientAndSendsNothing(t *testing.T) {
	var creds *Credentials
	p, srv := newTestProvider(t, func(c *Config) { creds = c.Credentials })
	if err := os.Remove(creds.SecretAccessKeyFile); err != nil {
		t.Fatal(err)
	}
	_, err := p.Get(ctx(t), formatProviderID(testZone, "i-0123456789abcdef0"))
	if providers.Class(err) != providers.ErrTransient || !strings.Contains(err.Error(), "not mounted") {
		t.Fatalf("err = %v, want Transient naming the unmounted Secret", err)
	}
	if st := p.Check(ctx(t)); st[0].Ready || st[0].Reason != "CredentialsUnreadable" {
		t.Fatalf("Check = %+v", st)
	}
	if n := len(srv.Calls()); n != 0 {
		t.Fatalf("%d requests went out without credentials", n)
	}
}

func TestCheckDescribesOnePageOnAFreshConnection(t *testing.T) {
	for _, tt := range []struct {
		name       string
		fail       *ec2api.Error
		wantReady  bool
		wantReason string
	}{
		{"working credentials", nil, true, "OK"},
		{"no describe permission", &ec2api.Error{Status: 403, Code: "UnauthorizedOperation", Message: "You are not authorized to perform this operation."}, false, "Forbidden"},
		{"region not enabled", &ec2api.Error{Status: 401, Code: "OptInRequired", Message: "You are not subscribed to this service."}, false, "RegionNotEnabled"},
		{"throttled", &ec2api.Error{Status: 503, Code: "RequestLimitExceeded", Message: "Request limit exceeded."}, false, "Throttled"},
		{"down", &ec2api.Error{Status: 500, Code: "InternalError", Message: "An internal error has occurred"}, false, "Unavailable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, func(c *Config) { c.Defaults.Zone = "" })
			if tt.fail != nil {
				srv.Fail(ec2api.DescribeInstances, *tt.fail)
			}
			got := p.Check(ctx(t))
			if len(got) != 1 || got[0].Target != testRegion || got[0].Ready != tt.wantReady || got[0].Reason != tt.wantReason {
				t.Fatalf("Check = %+v, want target %s ready=%v %s", got, testRegion, tt.wantReady, tt.wantReason)
			}
			calls := srv.Calls()
			if len(calls) != 1 || calls[0].Form.Get("MaxResults") != "5" || calls[0].Form.Get("Filter.1.Name") != "tag:"+TagManagedBy {
				t.Fatalf("calls = %+v, want one filtered page of 5", calls)
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
	if _, err := p.Get(ctx(t), formatProviderID(testZone, "i-0123456789abcdef0")); providers.Class(err) != providers.ErrTransient {
		t.Fatalf("err = %v, want Transient", err)
	}
}

// TestCreateRetriedWithOtherParametersAdoptsItsInstance: the launch's
// answer was lost, and by the retry the image filter resolves to a newer
// AMI. EC2 answers the token IdempotentParameterMismatch; Create finds the
// instance the token made and returns it instead of launching another.
func TestCreateRetriedWithOtherParametersAdoptsItsInstance(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	srv.FailAfter(ec2api.RunInstances, ec2api.Error{Status: 500, Code: "InternalError", Message: "An internal error has occurred"})
	if _, err := p.Create(ctx(t), testRequest()); providers.Class(err) != providers.ErrTransient {
		t.Fatalf("lost answer: %v, want Transient", err)
	}
	srv.AddImage(ec2api.Image{ID: "ami-0de12a00000000009", Name: "debian-12-amd64-20261206-0100", Owner: DebianOwner, Architecture: "x86_64", Created: time.Now()})
	inst, err := p.Create(ctx(t), testRequest())
	if err != nil {
		t.Fatalf("retried Create: %v", err)
	}
	all := srv.Instances()
	if len(all) != 1 || all[0].ImageID != ec2api.DebianAMD64 || inst.ProviderID != formatProviderID(testZone, all[0].ID) {
		t.Fatalf("instances %+v, Create %+v: want the one instance of the first attempt", all, inst)
	}
	if n := srv.CallCount(ec2api.RunInstances); n != 2 {
		t.Fatalf("RunInstances = %d, want 2 (the lost one, the mismatched retry)", n)
	}
}

// TestAWrongSecretIsRefusedBySignature: the key ID is known but the secret
// is not its own, so the SigV4 signature does not match; EC2's refusal is
// Permanent with its message, and nothing is launched.
func TestAWrongSecretIsRefusedBySignature(t *testing.T) {
	var creds *Credentials
	p, srv := newTestProvider(t, func(c *Config) { creds = c.Credentials })
	if err := os.WriteFile(creds.SecretAccessKeyFile, []byte("not-the-secret-of-this-key"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := p.Create(ctx(t), testRequest())
	if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "AWS was not able to validate the provided access credentials") {
		t.Fatalf("Create signed with a wrong secret: %v, want Permanent with the cloud's message", err)
	}
	if len(srv.Instances()) != 0 || len(srv.SecurityGroups()) != 0 {
		t.Fatal("a request signed with a wrong secret changed the cloud")
	}
}

// TestAGroupRunInstancesCannotSeeYet: EC2 is eventually consistent, so a
// launch may not see the managed group the provider saw or made a moment
// ago: Transient, retried. A group of the operator's EC2 does not know is
// a configuration error: Permanent.
func TestAGroupRunInstancesCannotSeeYet(t *testing.T) {
	notFound := ec2api.Error{Status: 400, Code: "InvalidGroup.NotFound", Message: "The security group 'sg-0aaaaaaaaaaaaaaa1' does not exist"}
	p, srv := newTestProvider(t, nil)
	srv.Fail(ec2api.RunInstances, notFound)
	if _, err := p.Create(ctx(t), testRequest()); providers.Class(err) != providers.ErrTransient {
		t.Fatalf("the managed group not visible yet: %v, want Transient", err)
	}
	p, srv = newTestProvider(t, func(c *Config) { c.SourceRanges, c.SecurityGroupIDs = nil, []string{"sg-0aaaaaaaaaaaaaaa1"} })
	srv.Fail(ec2api.RunInstances, notFound)
	if _, err := p.Create(ctx(t), testRequest()); !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), notFound.Message) {
		t.Fatalf("the operator's group does not exist: %v, want Permanent with EC2's message", err)
	}
}

// TestAGroupOfThatNameNotProxyfleetsIsNeverTakenOver: a group named as the
// managed one but without proxyfleet's tag belongs to someone else; Create
// fails Permanent naming it and changes none of its rules.
func TestAGroupOfThatNameNotProxyfleetsIsNeverTakenOver(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	open := []ec2api.Permission{{Protocol: "tcp", FromPort: 22, ToPort: 22, CIDRs: []string{"0.0.0.0/0"}}}
	srv.PutSecurityGroup(ec2api.SecurityGroup{Name: "proxyfleet-aws-eu-cluster-a", Description: "someone's", Ingress: open})
	_, err := p.Create(ctx(t), testRequest())
	if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "proxyfleet-aws-eu-cluster-a exists but is not proxyfleet's") {
		t.Fatalf("err = %v, want Permanent naming the group", err)
	}
	if g := srv.SecurityGroups(); len(g) != 1 || !equalPerms(g[0].Ingress, open) || len(srv.Instances()) != 0 {
		t.Fatalf("groups %+v, instances %d: someone's group must stay as it was and nothing launch", g, len(srv.Instances()))
	}
}
