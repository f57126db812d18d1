package gc

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/internal/testkit/ec2api"
	"github.com/proxyfleet/proxyfleet/providers"
	awsprovider "github.com/proxyfleet/proxyfleet/providers/aws"
)

// TestSweepTerminatesThisInstallationsAWSOrphansOnly runs the sweep on the
// real aws provider, on the real EC2 client, against the in-test EC2 API.
// The region holds an instance of this installation whose Proxy is gone, a
// live Proxy's instance, another installation's instance whose UID no
// Proxy here has, an instance of this installation already terminated, and
// an instance proxyfleet did not make. Past the grace period the sweep
// terminates the orphan alone.
func TestSweepTerminatesThisInstallationsAWSOrphansOnly(t *testing.T) {
	srv := ec2api.Start(t, "eu-west-1")
	dir := t.TempDir()
	creds := &awsprovider.Credentials{AccessKeyIDFile: filepath.Join(dir, "id"), SecretAccessKeyFile: filepath.Join(dir, "secret")}
	for f, v := range map[string]string{creds.AccessKeyIDFile: ec2api.DefaultAccessKeyID, creds.SecretAccessKeyFile: ec2api.DefaultSecretAccessKey} {
		if err := os.WriteFile(f, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	prov, err := awsprovider.New(context.Background(), awsprovider.Config{Region: "eu-west-1", Entry: "aws-eu",
		Defaults: providers.Placement{MachineType: "t3.micro"}, SourceRanges: []string{"203.0.113.0/24"},
		Endpoint: srv.URL, Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	launch := func(uid, installation string) string {
		inst, err := prov.Create(testCtx(t), providers.CreateRequest{Name: providers.NameFromUID(uid), OwnerUID: uid, Installation: installation,
			OwnerName: "px", OwnerNamespace: "crawl", Port: 3128, ProxyAuth: &providers.BasicAuth{Username: "proxyfleet", Password: "s3cret-" + uid}})
		if err != nil {
			t.Fatalf("Create %s: %v", uid, err)
		}
		return inst.ProviderID
	}
	orphan := launch("uid-orphan", testInstallation)
	live := launch("uid-live", testInstallation)
	foreign := launch("uid-foreign", "another-cluster")
	done := launch("uid-done", testInstallation)
	if err := prov.Delete(testCtx(t), done); err != nil {
		t.Fatal(err)
	}
	srv.SetState(instanceID(done), ec2api.StateTerminated)
	stranger := srv.Put(ec2api.Instance{Tags: map[string]string{"Name": "web-1"}})

	rec := &countingRecorder{}
	s := newSweeper(t, Options{
		Reader:    &proxyReader{proxies: []v1alpha1.Proxy{proxyWithUID("uid-live")}},
		Providers: map[string]providers.Provider{"aws-eu": prov},
		Clock:     clocktesting.NewFakeClock(time.Now().Add(time.Hour)),
		MinAge:    10 * time.Minute,
		Recorder:  rec,
	})
	res := s.sweep(testCtx(t))
	if res.errors != 0 {
		t.Fatalf("sweep errors: %+v", res)
	}
	if got := res.deleted["aws-eu"]; len(got) != 1 || got[0].ProviderID != orphan {
		t.Fatalf("deleted %+v, want the orphan %s alone", got, orphan)
	}
	state := map[string]string{}
	for _, in := range srv.Instances() {
		state[in.ID] = in.State
	}
	for id, want := range map[string]string{instanceID(orphan): ec2api.StateShuttingDown, instanceID(live): ec2api.StatePending,
		instanceID(foreign): ec2api.StatePending, instanceID(done): ec2api.StateTerminated, stranger: ec2api.StateRunning} {
		if state[id] != want {
			t.Errorf("%s is %s after the sweep, want %s", id, state[id], want)
		}
	}
	if want := map[string]int{"aws-eu/" + providers.PartVM: 1}; !maps.Equal(rec.counts, want) {
		t.Fatalf("counts = %v, want %v", rec.counts, want)
	}
}

// instanceID is the EC2 instance ID at the end of an aws providerID.
func instanceID(providerID string) string {
	return providerID[strings.LastIndex(providerID, "/")+1:]
}
