package gcp

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"google.golang.org/api/option"

	"github.com/proxyfleet/proxyfleet/internal/testkit/computeapi"
	"github.com/proxyfleet/proxyfleet/providers"
)

const (
	testProject = "proxy-project"
	testZone    = "europe-west1-b"
	testUID     = "0b6f2a3c-1111-4222-8333-444455556666"
)

// newTestProvider returns the provider on the real REST client, pointed at a
// fresh in-test Compute API without authentication.
func newTestProvider(t *testing.T, mutate func(*Config)) (*Provider, *computeapi.Server) {
	t.Helper()
	srv := computeapi.Start(t, testProject)
	c, err := compute.NewInstancesRESTClient(context.Background(), option.WithEndpoint(srv.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	cfg := Config{
		Project:     testProject,
		Defaults:    providers.Placement{Zone: testZone, MachineType: "e2-micro", Image: "projects/debian-cloud/global/images/family/debian-12"},
		NetworkTags: []string{"proxyfleet-squid"},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, srv
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

func TestCreateInsertsTheVMAndReturnsWithoutWaiting(t *testing.T) {
	p, srv := newTestProvider(t, func(c *Config) {
		c.Network, c.Subnetwork = "global/networks/crawl", "regions/europe-west1/subnetworks/crawl"
		c.ServiceAccount = "squid@proxy-project.iam.gserviceaccount.com"
		c.Labels = map[string]string{"team": "crawl", LabelOwnerUID: "forged", LabelInstallation: "forged"}
	})
	req := testRequest()
	req.Labels = map[string]string{"pool": "eu"}
	inst, err := p.Create(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	wantID := "zones/" + testZone + "/instances/" + req.Name
	if inst.ProviderID != wantID || inst.State != providers.StateProvisioning || inst.OwnerUID != testUID || inst.Installation != "cluster-a" {
		t.Fatalf("Create = %+v, want %s Provisioning", inst, wantID)
	}
	if calls := srv.Calls(); len(calls) != 1 || !strings.HasPrefix(calls[0], "POST /compute/v1/projects/"+testProject+"/zones/"+testZone+"/instances") {
		t.Fatalf("calls = %v, want exactly one insert (no operation wait)", calls)
	}
	got := srv.Instance(testZone, req.Name)
	labels := got["labels"].(map[string]any)
	for k, v := range map[string]string{LabelManagedBy: ManagedBy, LabelOwnerUID: testUID, LabelInstallation: "cluster-a", LabelOwnerName: "eu-1", "team": "crawl", "pool": "eu"} {
		if labels[k] != v {
			t.Errorf("label %s = %v, want %s (labels %v)", k, labels[k], v, labels)
		}
	}
	if mt := got["machineType"]; mt != "zones/"+testZone+"/machineTypes/e2-micro" {
		t.Errorf("machineType = %v", mt)
	}
	disk := got["disks"].([]any)[0].(map[string]any)
	if disk["boot"] != true || disk["autoDelete"] != true || disk["initializeParams"].(map[string]any)["sourceImage"] != "projects/debian-cloud/global/images/family/debian-12" {
		t.Errorf("boot disk = %v", disk)
	}
	nic := got["networkInterfaces"].([]any)[0].(map[string]any)
	if nic["network"] != "global/networks/crawl" || nic["subnetwork"] != "regions/europe-west1/subnetworks/crawl" {
		t.Errorf("network interface = %v", nic)
	}
	if acs, _ := nic["accessConfigs"].([]any); len(acs) != 1 || acs[0].(map[string]any)["type"] != "ONE_TO_ONE_NAT" {
		t.Errorf("external address type needs one ONE_TO_ONE_NAT access config, got %v", nic["accessConfigs"])
	}
	if tags := got["tags"].(map[string]any)["items"].([]any); len(tags) != 1 || tags[0] != "proxyfleet-squid" {
		t.Errorf("tags = %v", tags)
	}
	if sa := got["serviceAccounts"].([]any)[0].(map[string]any); sa["email"] != "squid@proxy-project.iam.gserviceaccount.com" {
		t.Errorf("service account = %v", sa)
	}
	items := got["metadata"].(map[string]any)["items"].([]any)
	ud := items[0].(map[string]any)
	if ud["key"] != "user-data" || !strings.HasPrefix(ud["value"].(string), "#cloud-config\n") {
		t.Errorf("user-data = %v", ud)
	}
}

func TestCreateInternalAddressTypeHasNoExternalIP(t *testing.T) {
	p, srv := newTestProvider(t, func(c *Config) { c.AddressType = AddressInternal })
	req := testRequest()
	if _, err := p.Create(ctx(t), req); err != nil {
		t.Fatal(err)
	}
	nic := srv.Instance(testZone, req.Name)["networkInterfaces"].([]any)[0].(map[string]any)
	if _, ok := nic["accessConfigs"]; ok {
		t.Fatalf("internal VMs get no access config (no public address), got %v", nic["accessConfigs"])
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
	ud := srv.Instance(testZone, req.Name)["metadata"].(map[string]any)["items"].([]any)[0].(map[string]any)["value"]
	if ud != string(req.CloudInit) {
		t.Fatalf("user-data = %q, want the Proxy's own cloud-init", ud)
	}
}

func TestCreateIsIdempotentOnAlreadyExists(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	req := testRequest()
	first, err := p.Create(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetStatus(testZone, req.Name, "RUNNING")
	srv.SetAddresses(testZone, req.Name, "10.132.0.7", "203.0.113.7")
	again, err := p.Create(ctx(t), req)
	if err != nil {
		t.Fatalf("a retried Create answered 409 must succeed: %v", err)
	}
	if again.ProviderID != first.ProviderID || again.State != providers.StateRunning || again.IP != "203.0.113.7" {
		t.Fatalf("retried Create = %+v, want the existing VM", again)
	}
	if n := srv.CallCount("POST "); n != 2 {
		t.Fatalf("inserts = %d, want 2", n)
	}
}

func TestCreateRefusesAVMItDoesNotOwn(t *testing.T) {
	for _, tt := range []struct {
		name   string
		labels map[string]any
		want   string
	}{
		{"not managed by proxyfleet", map[string]any{"team": "web"}, "not managed by proxyfleet"},
		{"another proxy's VM", map[string]any{LabelManagedBy: ManagedBy, LabelOwnerUID: "someone-else"}, `belongs to proxy UID "someone-else"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, nil)
			req := testRequest()
			srv.Put(testZone, map[string]any{"name": req.Name, "status": "RUNNING", "labels": tt.labels})
			_, err := p.Create(ctx(t), req)
			if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want ErrPermanent saying %q", err, tt.want)
			}
		})
	}
}

func TestCreateMissingPlacementIsPermanentAndCallsNothing(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mutate func(*providers.CreateRequest, *Config)
		want   string
	}{
		{"no zone", func(_ *providers.CreateRequest, c *Config) { c.Defaults.Zone = "" }, "placement.zone is required"},
		{"no machine type", func(_ *providers.CreateRequest, c *Config) { c.Defaults.MachineType = "" }, "placement.machineType is required"},
		{"no image", func(_ *providers.CreateRequest, c *Config) { c.Defaults.Image = "" }, "placement.image is required"},
		{"bad zone", func(r *providers.CreateRequest, _ *Config) { r.Placement.Zone = "europe" }, `placement.zone "europe" is not a zone`},
		{"no credentials for the bootstrap", func(r *providers.CreateRequest, _ *Config) { r.ProxyAuth = nil }, "refusing to boot an open proxy"},
		{"invalid extra label", func(r *providers.CreateRequest, _ *Config) { r.Labels = map[string]string{"Team": "x"} }, "label Team="},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var cfgMut func(*Config)
			req := testRequest()
			cfgMut = func(c *Config) { tt.mutate(&req, c) }
			p, srv := newTestProvider(t, cfgMut)
			_, err := p.Create(ctx(t), req)
			if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want ErrPermanent saying %q", err, tt.want)
			}
			if calls := srv.Calls(); len(calls) != 0 {
				t.Fatalf("a rejected request reached the API: %v", calls)
			}
		})
	}
}

func TestPlacementOverridesEntryDefaults(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	req := testRequest()
	req.Placement = providers.Placement{Zone: "us-central1-a", MachineType: "n2-standard-2", Image: "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"}
	inst, err := p.Create(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if inst.ProviderID != "zones/us-central1-a/instances/"+req.Name {
		t.Fatalf("providerID = %s", inst.ProviderID)
	}
	if mt := srv.Instance("us-central1-a", req.Name)["machineType"]; mt != "zones/us-central1-a/machineTypes/n2-standard-2" {
		t.Fatalf("machineType = %v", mt)
	}
}

func TestGetMapsEveryStatus(t *testing.T) {
	for _, tt := range []struct {
		status    string
		natIP     string
		addrType  string
		wantState providers.State
		wantIP    string
	}{
		{"RUNNING", "203.0.113.9", "", providers.StateRunning, "203.0.113.9"},
		{"RUNNING", "", "", providers.StateProvisioning, ""},
		{"RUNNING", "", AddressInternal, providers.StateRunning, "10.132.0.9"},
		{"PROVISIONING", "", "", providers.StateProvisioning, ""},
		{"STAGING", "203.0.113.9", "", providers.StateProvisioning, ""},
		{"STOPPING", "203.0.113.9", "", providers.StateStopped, ""},
		{"STOPPED", "", "", providers.StateStopped, ""},
		{"TERMINATED", "", "", providers.StateStopped, ""},
		{"SUSPENDED", "", "", providers.StateStopped, ""},
		{"REPAIRING", "203.0.113.9", "", providers.StateStopped, ""},
		{"SOMETHING_NEW", "203.0.113.9", "", providers.StateStopped, ""},
	} {
		t.Run(tt.status+"/"+tt.natIP+tt.addrType, func(t *testing.T) {
			p, srv := newTestProvider(t, func(c *Config) { c.AddressType = tt.addrType })
			req := testRequest()
			inst, err := p.Create(ctx(t), req)
			if err != nil {
				t.Fatal(err)
			}
			srv.SetStatus(testZone, req.Name, tt.status)
			srv.SetAddresses(testZone, req.Name, "10.132.0.9", tt.natIP)
			got, err := p.Get(ctx(t), inst.ProviderID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != tt.wantState || got.IP != tt.wantIP || got.OwnerUID != testUID || got.CreatedAt.IsZero() {
				t.Fatalf("Get = %+v, want %s at %q with owner and creation time", got, tt.wantState, tt.wantIP)
			}
		})
	}
}

func TestGetAbsentOrForeignVMIsNotFound(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	if _, err := p.Get(ctx(t), formatProviderID(testZone, "proxy-gone")); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("missing VM: err = %v, want ErrNotFound", err)
	}
	srv.Put(testZone, map[string]any{"name": "web-1", "status": "RUNNING"})
	if _, err := p.Get(ctx(t), formatProviderID(testZone, "web-1")); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("unmanaged VM: err = %v, want ErrNotFound", err)
	}
}

func TestMalformedProviderIDIsPermanentAndCallsNothing(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	for _, id := range []string{
		"", "proxy-abc", "zones/europe-west1-b/proxy-abc", "zones//instances/proxy-abc",
		"zones/europe-west1-b/instances/", "zones/europe-west1-b/instances/Proxy_ABC",
		"projects/p/zones/europe-west1-b/instances/proxy-abc", "zones/europe-west1-b/instances/proxy-abc/extra",
		"kubernetes://egress/proxy-abc", "regions/europe-west1/instances/proxy-abc",
	} {
		if _, err := p.Get(ctx(t), id); !errors.Is(err, providers.ErrPermanent) {
			t.Errorf("Get(%q) err = %v, want ErrPermanent", id, err)
		}
		if err := p.Delete(ctx(t), id); !errors.Is(err, providers.ErrPermanent) {
			t.Errorf("Delete(%q) err = %v, want ErrPermanent", id, err)
		}
	}
	if calls := srv.Calls(); len(calls) != 0 {
		t.Fatalf("malformed IDs reached the API: %v", calls)
	}
}

func TestDeleteIsFireAndForgetAndIdempotent(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	req := testRequest()
	inst, err := p.Create(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx(t), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if srv.Instance(testZone, req.Name) != nil {
		t.Fatal("Delete did not reach the API")
	}
	if err := p.Delete(ctx(t), inst.ProviderID); err != nil {
		t.Fatalf("deleting a VM that is gone (404) must succeed: %v", err)
	}
	if n := srv.CallCount("DELETE "); n != 2 {
		t.Fatalf("deletes = %d, want 2 (no operation polling in between)", n)
	}
	if n := len(srv.Calls()); n != 3 {
		t.Fatalf("calls = %v, want insert + two deletes", srv.Calls())
	}
}

func TestErrorsAreClassified(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  computeapi.Error
		want error
	}{
		{"429 rate limit", computeapi.Error{Code: 429, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded"}, providers.ErrQuotaExceeded},
		{"403 quotaExceeded", computeapi.Error{Code: 403, Reason: "quotaExceeded", Message: "Quota 'CPUS' exceeded. Limit: 8.0 in region europe-west1."}, providers.ErrQuotaExceeded},
		{"403 rateLimitExceeded", computeapi.Error{Code: 403, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded"}, providers.ErrQuotaExceeded},
		{"zone resource pool exhausted", computeapi.Error{Code: 503, Reason: "resourceExhausted", Message: "ZONE_RESOURCE_POOL_EXHAUSTED: The zone does not have enough resources"}, providers.ErrQuotaExceeded},
		{"400 invalid", computeapi.Error{Code: 400, Reason: "invalid", Message: "Invalid value for field 'resource.machineType'"}, providers.ErrPermanent},
		{"403 forbidden", computeapi.Error{Code: 403, Reason: "forbidden", Message: "Required 'compute.instances.create' permission"}, providers.ErrPermanent},
		{"404 on insert (image missing)", computeapi.Error{Code: 404, Reason: "notFound", Message: "The resource 'projects/x/global/images/y' was not found"}, providers.ErrNotFound},
		{"500", computeapi.Error{Code: 500, Reason: "backendError", Message: "Internal error"}, providers.ErrTransient},
		{"503", computeapi.Error{Code: 503, Reason: "backendError", Message: "Service unavailable"}, providers.ErrTransient},
		{"401 expired token", computeapi.Error{Code: 401, Reason: "authError", Message: "Invalid Credentials"}, providers.ErrTransient},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, nil)
			srv.Fail(computeapi.OpInsert, tt.err)
			_, err := p.Create(ctx(t), testRequest())
			if got := providers.Class(err); got != tt.want {
				t.Fatalf("Class(%v) = %v, want %v", err, got, tt.want)
			}
			// Create has returned, so a retry loop in the SDK would have
			// sent the insert again: one insert says the error went
			// straight to the reconciler (a wall-clock bound said the same
			// and failed a busy make test at 8s).
			if n := srv.CallCount("POST "); n != 1 {
				t.Fatalf("inserts = %d: the SDK retried instead of handing the error to the reconciler", n)
			}
		})
	}
}

func TestNetworkErrorIsTransient(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	srv.Close()
	_, err := p.Get(ctx(t), formatProviderID(testZone, "proxy-abc"))
	if providers.Class(err) != providers.ErrTransient {
		t.Fatalf("err = %v, want ErrTransient", err)
	}
}

func TestDeleteFailureOtherThan404IsReported(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	srv.Fail(computeapi.OpDelete, computeapi.Error{Code: 403, Reason: "forbidden", Message: "Required 'compute.instances.delete' permission"})
	err := p.Delete(ctx(t), formatProviderID(testZone, "proxy-abc"))
	if !errors.Is(err, providers.ErrPermanent) {
		t.Fatalf("err = %v, want ErrPermanent", err)
	}
}

func TestListByTagFollowsEveryPageAndSkipsWarningScopes(t *testing.T) {
	p, srv := newTestProvider(t, nil)
	zones := []string{"asia-east1-a", "europe-west1-b", "europe-west4-c", "us-central1-a", "us-east1-b"}
	for i, z := range zones {
		srv.Put(z, map[string]any{"name": "proxy-" + strings.ReplaceAll(z, "-", ""), "status": "RUNNING",
			"labels": map[string]any{LabelManagedBy: ManagedBy, LabelOwnerUID: "uid-" + string(rune('a'+i)), LabelInstallation: "cluster-" + string(rune('a'+i))}})
	}
	srv.Put("europe-west1-b", map[string]any{"name": "web-1", "status": "RUNNING", "labels": map[string]any{"team": "web"}})
	srv.AddScopeWarning("zones/europe-north1-a", "NO_RESULTS_ON_PAGE")
	srv.AddScopeWarning("regions/europe-west1", "NO_RESULTS_ON_PAGE")
	srv.SetPageSize(2)
	got, err := p.ListByTag(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(zones) {
		t.Fatalf("ListByTag = %d instances %+v, want %d (all pages, managed only)", len(got), got, len(zones))
	}
	seen := map[string]bool{}
	for _, inst := range got {
		seen[inst.ProviderID] = true
		if inst.OwnerUID == "" || inst.CreatedAt.IsZero() || inst.Installation != "cluster-"+strings.TrimPrefix(inst.OwnerUID, "uid-") {
			t.Errorf("%s lacks owner, installation or creation time: %+v", inst.ProviderID, inst)
		}
	}
	for _, z := range zones {
		if id := formatProviderID(z, "proxy-"+strings.ReplaceAll(z, "-", "")); !seen[id] {
			t.Errorf("missing %s", id)
		}
	}
	var filters, pages int
	for _, c := range srv.Calls() {
		if strings.Contains(c, "filter=labels.managed-by+%3D+proxyfleet") || strings.Contains(c, "filter=labels.managed-by%20%3D%20proxyfleet") {
			filters++
		}
		if strings.Contains(c, "pageToken=") {
			pages++
		}
	}
	if calls := len(srv.Calls()); calls != 4 || filters != 4 || pages != 3 {
		t.Fatalf("calls = %v: want 4 filtered pages (8 scopes, 2 per page)", srv.Calls())
	}
}

func TestListByTagFailsAsAWhole(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup func(*computeapi.Server)
	}{
		{"the second page fails", func(s *computeapi.Server) {
			s.SetPageSize(1)
			s.Put("us-east1-b", map[string]any{"name": "proxy-b", "labels": map[string]any{LabelManagedBy: ManagedBy}})
			s.FailPage("page-1", computeapi.Error{Code: 500, Reason: "backendError", Message: "Internal error"})
		}},
		{"the first page fails", func(s *computeapi.Server) {
			s.Fail(computeapi.OpList, computeapi.Error{Code: 403, Reason: "forbidden", Message: "Required 'compute.instances.list' permission"})
		}},
		{"a zone is unreachable", func(s *computeapi.Server) {
			s.AddScopeWarning("zones/us-west1-a", "UNREACHABLE")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, nil)
			srv.Put("europe-west1-b", map[string]any{"name": "proxy-a", "labels": map[string]any{LabelManagedBy: ManagedBy}})
			tt.setup(srv)
			got, err := p.ListByTag(ctx(t))
			if err == nil || got != nil {
				t.Fatalf("ListByTag = %+v, %v; want an error and no partial list", got, err)
			}
		})
	}
}

func TestCheckReadsOnePageOfOneManagedVM(t *testing.T) {
	for _, tt := range []struct {
		name       string
		fail       *computeapi.Error
		wantReady  bool
		wantReason string
	}{
		{"working credentials", nil, true, "OK"},
		{"no list permission", &computeapi.Error{Code: 403, Reason: "forbidden", Message: "Required 'compute.instances.list' permission for 'projects/proxy-project'"}, false, "Forbidden"},
		{"API disabled", &computeapi.Error{Code: 403, Reason: "accessNotConfigured", Message: "Compute Engine API has not been used in project 123 before or it is disabled."}, false, "APIDisabled"},
		{"bad credentials", &computeapi.Error{Code: 401, Reason: "authError", Message: "Invalid Credentials"}, false, "Unauthorized"},
		{"rate limited", &computeapi.Error{Code: 429, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded"}, false, "QuotaExceeded"},
		{"backend down", &computeapi.Error{Code: 503, Reason: "backendError", Message: "unavailable"}, false, "Unavailable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, nil)
			for _, z := range []string{"europe-west1-b", "us-east1-b", "us-west1-a"} {
				srv.Put(z, map[string]any{"name": "proxy-" + strings.ReplaceAll(z, "-", ""), "labels": map[string]any{LabelManagedBy: ManagedBy}})
			}
			if tt.fail != nil {
				srv.Fail(computeapi.OpList, *tt.fail)
			}
			got := p.Check(ctx(t))
			if len(got) != 1 || got[0].Target != testProject || got[0].Ready != tt.wantReady || got[0].Reason != tt.wantReason {
				t.Fatalf("Check = %+v, want one target %s ready=%v reason %s", got, testProject, tt.wantReady, tt.wantReason)
			}
			calls := srv.Calls()
			if len(calls) != 1 || !strings.Contains(calls[0], "maxResults=1") || !strings.Contains(calls[0], "filter=labels.managed-by") {
				t.Fatalf("calls = %v, want exactly one filtered page with maxResults=1", calls)
			}
		})
	}
}

func TestParseProviderIDRoundTrips(t *testing.T) {
	id := formatProviderID("us-central1-f", "proxy-abcdefghijklmnop")
	zone, name, err := parseProviderID(id)
	if err != nil || zone != "us-central1-f" || name != "proxy-abcdefghijklmnop" {
		t.Fatalf("parseProviderID(%q) = %q, %q, %v", id, zone, name, err)
	}
}

func TestCreateUndoesAnInsertWhoseOperationEndedInError(t *testing.T) {
	tests := []struct {
		name    string
		failure computeapi.OperationFailure
		class   error
	}{
		{"a zone out of capacity waits as quota, and what the insert began is deleted",
			computeapi.OperationFailure{HTTPStatus: 503, Code: "ZONE_RESOURCE_POOL_EXHAUSTED", Message: "The zone does not have enough resources", Leave: true},
			providers.ErrQuotaExceeded},
		{"a missing image is permanent and leaves nothing",
			computeapi.OperationFailure{HTTPStatus: 400, Code: "RESOURCE_NOT_FOUND", Message: "The resource 'projects/x/global/images/y' was not found"},
			providers.ErrPermanent},
		{"an internal error is transient",
			computeapi.OperationFailure{HTTPStatus: 500, Code: "INTERNAL_ERROR", Message: "Internal error", Leave: true},
			providers.ErrTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, srv := newTestProvider(t, nil)
			srv.FailInsertOperations(tt.failure)
			_, err := p.Create(ctx(t), testRequest())
			if got := providers.Class(err); got != tt.class {
				t.Fatalf("Class(%v) = %v, want %v", err, got, tt.class)
			}
			if !strings.Contains(err.Error(), tt.failure.Code) {
				t.Fatalf("err = %v, want the operation's code", err)
			}
			if left := srv.Instances(); len(left) != 0 {
				t.Fatalf("instances after the failed Create = %v, want none", left)
			}
			id, err := p.ProviderIDFor(testRequest())
			if err != nil || id != "zones/"+testZone+"/instances/"+testRequest().Name {
				t.Fatalf("ProviderIDFor = %q, %v", id, err)
			}
		})
	}
}
