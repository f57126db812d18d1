package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/proxyfleet/proxyfleet/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/controller/credentials"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/internal/testkit/computeapi"
	"github.com/proxyfleet/proxyfleet/internal/testkit/doapi"
	"github.com/proxyfleet/proxyfleet/internal/testkit/ec2api"
	"github.com/proxyfleet/proxyfleet/internal/testkit/hcloudapi"
	"github.com/proxyfleet/proxyfleet/internal/testkit/libvirtd"
	"github.com/proxyfleet/proxyfleet/internal/testutil"
	"github.com/proxyfleet/proxyfleet/internal/testutil/gen"
	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
)

// guestBootTimeout is how long a guest may take from its Proxy's creation
// to Ready: the image download and upload, then a boot under software
// emulation (about 90 s to cloud-init's end on an idle core) on a CI
// machine whose two cores the other e2e tests share.
const guestBootTimeout = 8 * time.Minute

// TestControllerBinaryBootsARealSquidGuest is the VM fleet end to end: a
// real Debian guest (make guest-image) booted by a real libvirtd, reached
// over a real sshd, by the real controller binary with a kvm provider
// entry, in a network namespace the test makes (every guest address lives
// only there). The guest boots its overlay with the generated NoCloud seed;
// cloud-init writes Squid's configuration and login before Squid starts; the
// provider reads the address from the DHCP lease; the health engine probes
// through the guest's Squid with the Proxy's login until the Proxy is
// Ready. Beside it the same image boots the gcp provider's bootstrap: a
// gcp entry on the in-test Compute Engine inserts an instance, whose
// user-data metadata becomes a second guest's NoCloud seed, and that Proxy
// turns Ready the same way; and the aws provider's: an aws entry on the
// in-test EC2 launches an instance whose UserData becomes a third guest's
// seed; and, once those are gone, the digitalocean and hetzner providers'
// (entries on the in-test DigitalOcean and Hetzner Cloud APIs), one guest
// after the other, each booting the user_data its provider created the
// droplet or server with. A --lease-api gateway carries requests to
// a target on the guests' network, which sees a guest's address as the
// source, and each guest's Squid refuses a request without the login (407),
// a CONNECT to a port other than 443, and the metadata address and a
// private range (403).
// Editing the spec replaces the guest: here with a deliberately broken
// bootstrap (Squid's configuration invalid), whose failure report carries
// the guest's cloud-init output and Squid's own complaint from the serial
// console. Deleting the Proxy removes the domain, its overlay and its seed.
func TestControllerBinaryBootsARealSquidGuest(t *testing.T) {
	if !testutil.InNetNS(t) {
		return
	}
	started := time.Now()
	bin := testutil.BuildBinary(t)
	image := libvirtd.GuestImagePath(t)
	host := libvirtd.StartGuestHost(t, image)
	lvd := host.Libvirtd
	t.Logf("guests run with domain type %q: %s", lvd.DomainType, lvd.KVMReason)
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	target := testutil.StartTarget(t, testutil.TargetOptions{Host: host.BridgeIP})

	compute := computeapi.Start(t, "proxy-project")
	ec2 := ec2api.Start(t, ec2Region)
	keyID, secretKey := filepath.Join(t.TempDir(), "aws-access-key-id"), filepath.Join(t.TempDir(), "aws-secret-access-key")
	writeFile(t, keyID, ec2api.DefaultAccessKeyID+"\n")
	writeFile(t, secretKey, ec2api.DefaultSecretAccessKey+"\n")
	do := doapi.Start(t)
	doToken := filepath.Join(t.TempDir(), "digitalocean-token")
	writeFile(t, doToken, doapi.DefaultToken+"\n")
	hz := hcloudapi.Start(t)
	hzToken := filepath.Join(t.TempDir(), "hetzner-token")
	writeFile(t, hzToken, hcloudapi.DefaultToken+"\n")
	config := filepath.Join(t.TempDir(), "providers.yaml")
	writeFile(t, config, host.Config+`  - name: gcp-test
    type: gcp
    gcp:
      project: proxy-project
      endpoint: `+compute.URL+`
      noAuth: true
      addressType: internal
      defaults: {zone: `+gceZone+`, machineType: e2-micro, image: projects/debian-cloud/global/images/family/debian-12}
  - name: aws-test
    type: aws
    aws:
      region: `+ec2Region+`
      endpoint: `+ec2.URL+`
      credentials: {accessKeyIDFile: `+keyID+`, secretAccessKeyFile: `+secretKey+`}
      addressType: private
      sourceRanges: [`+libvirtd.GuestSubnet.String()+`]
      defaults: {machineType: t3.micro}
  - name: do-test
    type: digitalocean
    digitalocean:
      region: ams3
      endpoint: `+do.URL+`
      tokenFile: `+doToken+`
      sourceRanges: [`+libvirtd.GuestSubnet.String()+`]
      defaults: {machineType: s-1vcpu-512mb-10gb}
  - name: hetzner-test
    type: hetzner
    hetzner:
      location: fsn1
      endpoint: `+hz.Endpoint()+`
      tokenFile: `+hzToken+`
      sourceRanges: [`+libvirtd.GuestSubnet.String()+`]
      defaults: {machineType: cx22}
`)
	const apiToken = "e2e-guest-token"
	tokenFile := filepath.Join(t.TempDir(), "lease-api-token")
	writeFile(t, tokenFile, apiToken+"\n")
	ctl := startController(t, bin, env, ns, "--providers-config", config, "--lease-api-token-file", tokenFile, "--health-tick", "500ms")

	px := gen.Proxy("vm-1", gen.SetProxyNamespace(ns), gen.SetProxyManaged("kvm-local"), gen.SetProxyPort(3128),
		gen.SetProxyHealthCheck(v1alpha1.HealthCheck{URL: target.URL() + "/health", IntervalSeconds: 5, TimeoutSeconds: 5}))
	gx := px.DeepCopy()
	gx.Name, gx.Spec.Provider = "gce-1", "gcp-test"
	ax := px.DeepCopy()
	ax.Name, ax.Spec.Provider = "ec2-1", "aws-test"
	dx := px.DeepCopy()
	dx.Name, dx.Spec.Provider = "do-1", "do-test"
	hx := px.DeepCopy()
	hx.Name, hx.Spec.Provider = "hz-1", "hetzner-test"
	for _, p := range []*v1alpha1.Proxy{px, gx, ax, dx, hx} {
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// The gcp Proxy's VM: the instance the provider inserted, booted here
	// from the same image with the user-data of its metadata as the seed,
	// its DHCP address reported as Compute Engine reports a VPC address.
	gceName := bootGCEInstance(t, env.Client, compute, lvd, image, ns, "gce-1")

	p := waitGuestReady(t, env.Client, host, ctl, ns, "vm-1")
	name := providers.NameFromUID(string(p.UID))
	t.Logf("the guest %s is Ready at %s, %s after the test began", name, p.Status.IP, time.Since(started).Round(time.Second))
	if target.Count(p.Status.IP) == 0 {
		t.Fatalf("Ready, but the target saw no probe from the guest's address %s (sources %v)", p.Status.IP, target.Sources())
	}

	login := guestLogin(t, env.Client, p)
	requireGuestSquid(t, net.JoinHostPort(p.Status.IP, "3128"), login, target, host.BridgeIP)

	g := waitGuestReady(t, env.Client, host, ctl, ns, "gce-1")
	t.Logf("the gcp bootstrap's guest %s is Ready at %s, %s after the test began", gceName, g.Status.IP, time.Since(started).Round(time.Second))
	if target.Count(g.Status.IP) == 0 {
		t.Fatalf("gce-1 is Ready, but the target saw no probe from its guest's address %s (sources %v)", g.Status.IP, target.Sources())
	}
	requireGuestSquid(t, net.JoinHostPort(g.Status.IP, "3128"), guestLogin(t, env.Client, g), target, host.BridgeIP)

	// The aws Proxy's VM boots once the other two are up: three guests
	// under TCG at once on a two-core machine (CI's) is one boot too many
	// for guestBootTimeout when anything else runs beside them.
	ec2Name := bootEC2Instance(t, env.Client, ec2, lvd, image, ns, "ec2-1")
	a := waitGuestReady(t, env.Client, host, ctl, ns, "ec2-1")
	t.Logf("the aws bootstrap's guest %s is Ready at %s, %s after the test began", ec2Name, a.Status.IP, time.Since(started).Round(time.Second))
	if target.Count(a.Status.IP) == 0 {
		t.Fatalf("ec2-1 is Ready, but the target saw no probe from its guest's address %s (sources %v)", a.Status.IP, target.Sources())
	}
	requireGuestSquid(t, net.JoinHostPort(a.Status.IP, "3128"), guestLogin(t, env.Client, a), target, host.BridgeIP)
	poolToken := filepath.Join(t.TempDir(), "pool-token")
	writeFile(t, poolToken, apiToken+"\n")
	gw := startGateway(t, bin, gwConfig{args: []string{"--lease-api", "http://" + ctl.leaseAPIAddr, "--pool-token-file", poolToken}})
	guests := map[string]string{ns + "/vm-1": p.Status.IP, ns + "/gce-1": g.Status.IP, ns + "/ec2-1": a.Status.IP}
	for i := range 4 {
		var r getResult
		poll.Until(t, 60*time.Second, "a request through a guest", func() error {
			var err error
			if r, err = doGet(gw.client(t, "", nil), target.URL()+fmt.Sprintf("/through-a-guest/%d", i), nil); err != nil || r.status != http.StatusOK {
				return fmt.Errorf("through the gateway: %d %v (%s)", r.status, err, r.reason)
			}
			return nil
		})
		if want, ok := guests[r.proxy]; !ok || r.source != want {
			t.Fatalf("the request reached the target from %s via %q, want a guest's address as the source (%v)", r.source, r.proxy, guests)
		}
	}
	for _, cloud := range []*v1alpha1.Proxy{g, a} {
		if err := env.Client.Delete(ctx, cloud); err != nil {
			t.Fatal(err)
		}
	}
	lv := lvd.Connect(t)
	defer func() { _ = lv.Disconnect() }()
	for _, vm := range []string{gceName, ec2Name} {
		if dom, err := lv.DomainLookupByName(vm); err == nil {
			_ = lv.DomainDestroy(dom)
		}
	}
	poll.Until(t, 2*time.Minute, "the ec2-1 instance terminated", func() error {
		return poll.Check(len(ec2.Live()) == 0, "instances not terminated: %+v", ec2.Live())
	})

	// The digitalocean and hetzner Proxies' VMs boot one after the other
	// once the gcp and aws guests are gone, so no more than two guests
	// ever run under TCG at once; each is checked as a stranger and with
	// its login, then deleted with its droplet or server.
	cloudStarted := time.Now()
	for _, c := range []struct {
		name string
		boot func() (vm string, left func() int)
	}{
		{"do-1", func() (string, func() int) {
			return bootDroplet(t, env.Client, do, lvd, image, ns, "do-1"), func() int { return len(do.Droplets()) }
		}},
		{"hz-1", func() (string, func() int) {
			return bootHetznerServer(t, env.Client, hz, lvd, image, ns, "hz-1"), func() int { return len(hz.Servers()) }
		}},
	} {
		booted := time.Now()
		vm, left := c.boot()
		g := waitGuestReady(t, env.Client, host, ctl, ns, c.name)
		t.Logf("%s's guest %s is Ready at %s, %s after its boot began", c.name, vm, g.Status.IP, time.Since(booted).Round(time.Second))
		if target.Count(g.Status.IP) == 0 {
			t.Fatalf("%s is Ready, but the target saw no probe from its guest's address %s (sources %v)", c.name, g.Status.IP, target.Sources())
		}
		requireGuestSquid(t, net.JoinHostPort(g.Status.IP, "3128"), guestLogin(t, env.Client, g), target, host.BridgeIP)
		if err := env.Client.Delete(ctx, g); err != nil {
			t.Fatal(err)
		}
		if dom, err := lv.DomainLookupByName(vm); err == nil {
			_ = lv.DomainDestroy(dom)
		}
		poll.Until(t, 2*time.Minute, c.name+"'s instance deleted", func() error {
			return poll.Check(left() == 0, "%d left", left())
		})
	}
	t.Logf("the digitalocean and hetzner guests took %s together", time.Since(cloudStarted).Round(time.Second))

	// The spec edit: a bootstrap of the Proxy's own, the generated one with
	// an option Squid does not know on its http_port.
	broken, err := bootstrap.Squid(name, 3128, *login)
	if err != nil {
		t.Fatal(err)
	}
	brokenConf := strings.Replace(string(broken), "http_port 3128", "http_port 3128 no-such-option", 1)
	if brokenConf == string(broken) {
		t.Fatalf("the bootstrap has no http_port 3128 line to break:\n%s", broken)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	before, err := lv.DomainLookupByName(name)
	if err != nil {
		t.Fatalf("the running guest's domain: %v", err)
	}
	p.Spec.CloudInit = &v1alpha1.CloudInit{Inline: brokenConf}
	if err := env.Client.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	// Each check reads a console log or a libvirt listing: once a second is
	// enough, and a failure carries the guest's report.
	guestPoll := []poll.Option{poll.Every(time.Second), poll.Report(func() string { return guestReport(host, ctl, name) })}
	left := false // the Proxy has left Ready since the edit
	poll.Until(t, guestBootTimeout, "a new guest whose Squid reports its configuration error on the console", func() error {
		var got v1alpha1.Proxy
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
			return err
		}
		if got.Status.Phase != v1alpha1.PhaseReady {
			left = true
		} else if left {
			t.Fatalf("the guest with an invalid squid.conf became Ready:\n%s", guestReport(host, ctl, name))
		}
		dom, err := lv.DomainLookupByName(name)
		if err != nil || dom.UUID == before.UUID {
			return fmt.Errorf("phase %s; the guest not replaced yet (%v)", got.Status.Phase, err)
		}
		return poll.Check(strings.Contains(host.Consoles.Log(name), "no-such-option"), "phase %s; no complaint on the console yet", got.Status.Phase)
	}, guestPoll...)
	report := guestReport(host, ctl, name)
	for _, want := range []string{"Cloud-init v.", "no-such-option", "squid.service"} {
		if !strings.Contains(report, want) {
			t.Fatalf("the failure report lacks %q:\n%s", want, report)
		}
	}
	if got := (&v1alpha1.Proxy{}); env.Client.Get(ctx, client.ObjectKeyFromObject(p), got) != nil || got.Status.Phase == v1alpha1.PhaseReady {
		t.Fatalf("the Proxy with the broken bootstrap is %s, want not Ready", got.Status.Phase)
	}
	t.Logf("the broken bootstrap's guest reported on its console (a failing test attaches the whole console, the QEMU log and the controller's output):\n%s",
		lastLines(strings.Join(grepLines(host.Consoles.Log(name), "cloud-init["), "\n"), 30))

	if err := env.Client.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 2*time.Minute, "the Proxy gone", func() error {
		var got v1alpha1.Proxy
		err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "vm-1"}, &got)
		return poll.Check(apierrors.IsNotFound(err), "still there: %s", string(got.Status.Phase))
	}, guestPoll...)
	poll.Until(t, time.Minute, "the domain, its overlay and its seed removed", func() error {
		if _, err := lv.DomainLookupByName(name); err == nil {
			return fmt.Errorf("the domain %s is still defined", name)
		}
		var left []string
		for _, f := range lvd.PoolFiles(t) {
			if strings.HasPrefix(f, name) {
				left = append(left, f)
			}
		}
		return poll.Check(len(left) == 0, "the pool still holds %v", left)
	}, guestPoll...)
	t.Logf("the whole test took %s", time.Since(started).Round(time.Second))
}

// requireGuestSquid checks a guest's Squid at addr (host:port) as a
// stranger and as a client with login would: a request without the login
// or with a wrong password is 407, the logged-in control reaches target, a
// CONNECT to port 22 and requests for the metadata address and a private
// range are 403.
func requireGuestSquid(t *testing.T, addr string, login *providers.BasicAuth, target *testutil.Target, bridgeIP string) {
	t.Helper()
	for _, tc := range []struct {
		what   string
		user   *url.Userinfo
		method string
		to     string
		want   int
	}{
		{"a request without the login", nil, http.MethodGet, target.URL() + "/no-login", http.StatusProxyAuthRequired},
		{"a request with a wrong password", url.UserPassword(login.Username, login.Password+"x"), http.MethodGet, target.URL() + "/wrong", http.StatusProxyAuthRequired},
		{"the logged-in control", url.UserPassword(login.Username, login.Password), http.MethodGet, target.URL() + "/logged-in", http.StatusOK},
		{"a CONNECT to port 22", url.UserPassword(login.Username, login.Password), http.MethodConnect, net.JoinHostPort(bridgeIP, "22"), http.StatusForbidden},
		{"the metadata address", url.UserPassword(login.Username, login.Password), http.MethodGet, "http://169.254.169.254/computeMetadata/v1/", http.StatusForbidden},
		{"a private range", url.UserPassword(login.Username, login.Password), http.MethodGet, "http://10.20.30.40:8080/", http.StatusForbidden},
	} {
		if got := askSquid(t, addr, tc.user, tc.method, tc.to); got != tc.want {
			t.Errorf("%s through the guest's Squid: %d, want %d", tc.what, got, tc.want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

}

// gceZone is the zone of the gcp entry's instances.
const gceZone = "europe-west1-b"

// bootGCEInstance waits for the instance the gcp provider inserts for
// Proxy ns/name, boots it here: the guest image with the user-data key of
// the instance's metadata as its NoCloud seed, and reports the guest's
// DHCP address as the instance's VPC address with status RUNNING, as
// Compute Engine would. It returns the instance's name.
func bootGCEInstance(t *testing.T, c client.Client, compute *computeapi.Server, lvd *libvirtd.Daemon, image, ns, name string) string {
	t.Helper()
	var vm, userData string
	poll.Until(t, pollTimeout, name+": its instance inserted", func() error {
		var p v1alpha1.Proxy
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p); err != nil {
			return err
		}
		vm = providers.NameFromUID(string(p.UID))
		inst := compute.Instance(gceZone, vm)
		if inst == nil {
			return fmt.Errorf("instances: %v", compute.Instances())
		}
		md, _ := inst["metadata"].(map[string]any)
		items, _ := md["items"].([]any)
		for _, it := range items {
			if kv, _ := it.(map[string]any); kv["key"] == "user-data" {
				userData, _ = kv["value"].(string)
			}
		}
		return poll.Check(userData != "", "the instance's metadata has no user-data: %v", md)
	})
	lvd.BootSeeded(t, vm, image, []byte(userData))
	ip := lvd.LeasedAddr(t, vm, guestBootTimeout)
	compute.SetAddresses(gceZone, vm, ip, "")
	compute.SetStatus(gceZone, vm, "RUNNING")
	return vm
}

// ec2Region is the region of the aws entry.
const ec2Region = "eu-west-1"

// bootEC2Instance waits for the instance the aws provider launches for
// Proxy ns/name, boots it here: the guest image with the instance's
// UserData as its NoCloud seed, and reports the guest's DHCP address as
// the instance's private address with state running, as EC2 would. It
// returns the guest's (the instance's Name tag) name.
func bootEC2Instance(t *testing.T, c client.Client, ec2 *ec2api.Server, lvd *libvirtd.Daemon, image, ns, name string) string {
	t.Helper()
	var inst ec2api.Instance
	poll.Until(t, pollTimeout, name+": its instance launched", func() error {
		var p v1alpha1.Proxy
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p); err != nil {
			return err
		}
		for _, in := range ec2.Live() {
			if in.Tags["proxyfleet.io/proxy-uid"] == string(p.UID) {
				inst = in
				return poll.Check(in.UserData != "", "instance %s has no user-data", in.ID)
			}
		}
		return fmt.Errorf("instances: %+v", ec2.Instances())
	})
	vm := inst.Tags["Name"]
	lvd.BootSeeded(t, vm, image, []byte(inst.UserData))
	ip := lvd.LeasedAddr(t, vm, guestBootTimeout)
	ec2.SetAddresses(inst.ID, ip, "", "")
	ec2.SetState(inst.ID, ec2api.StateRunning)
	return vm
}

// bootDroplet waits for the droplet the digitalocean provider creates for
// Proxy ns/name, boots it here: the guest image with the droplet's
// user_data as its NoCloud seed, and reports the guest's DHCP address as
// the droplet's public IPv4 with status active, as DigitalOcean would. It
// returns the guest's (the droplet's) name.
func bootDroplet(t *testing.T, c client.Client, do *doapi.Server, lvd *libvirtd.Daemon, image, ns, name string) string {
	t.Helper()
	var d doapi.Droplet
	poll.Until(t, pollTimeout, name+": its droplet created", func() error {
		var p v1alpha1.Proxy
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p); err != nil {
			return err
		}
		for _, in := range do.Droplets() {
			if slices.Contains(in.Tags, "proxyfleet-uid:"+string(p.UID)) {
				d = in
				return poll.Check(in.UserData != "", "droplet %d has no user-data", in.ID)
			}
		}
		return fmt.Errorf("droplets: %+v", do.Droplets())
	})
	lvd.BootSeeded(t, d.Name, image, []byte(d.UserData))
	ip := lvd.LeasedAddr(t, d.Name, guestBootTimeout)
	do.SetAddresses(d.ID, ip, "", "")
	do.SetStatus(d.ID, doapi.StatusActive)
	return d.Name
}

// bootHetznerServer waits for the server the hetzner provider creates for
// Proxy ns/name, boots it here: the guest image with the server's
// user_data as its NoCloud seed, and reports the guest's DHCP address as
// the server's public IPv4 with status running, as Hetzner would. It
// returns the guest's (the server's) name.
func bootHetznerServer(t *testing.T, c client.Client, hz *hcloudapi.API, lvd *libvirtd.Daemon, image, ns, name string) string {
	t.Helper()
	var s hcloudapi.Server
	poll.Until(t, pollTimeout, name+": its server created", func() error {
		var p v1alpha1.Proxy
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p); err != nil {
			return err
		}
		for _, in := range hz.Servers() {
			if in.Labels["proxyfleet.io/proxy-uid"] == string(p.UID) {
				s = in
				return poll.Check(in.UserData != "", "server %d has no user-data", in.ID)
			}
		}
		return fmt.Errorf("servers: %+v", hz.Servers())
	})
	lvd.BootSeeded(t, s.Name, image, []byte(s.UserData))
	ip := lvd.LeasedAddr(t, s.Name, guestBootTimeout)
	hz.SetAddresses(s.ID, ip, "")
	hz.SetStatus(s.ID, hcloudapi.StatusRunning)
	return s.Name
}

// waitGuestReady waits up to guestBootTimeout for the Proxy to be Ready
// with an address, failing with the guest's console, the QEMU log and the
// controller's output when it is not.
func waitGuestReady(t *testing.T, c client.Client, host *libvirtd.GuestHost, ctl *controllerProc, ns, name string) *v1alpha1.Proxy {
	t.Helper()
	var p v1alpha1.Proxy
	deadline, logged := time.Now().Add(guestBootTimeout), time.Now()
	for {
		err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p)
		if err == nil && p.Status.Phase == v1alpha1.PhaseReady && p.Status.IP != "" && meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHealthy) {
			return &p
		}
		if time.Since(logged) > time.Minute {
			logged = time.Now()
			t.Logf("%s/%s: phase %s, ip %q; the console's last line: %s", ns, name, p.Status.Phase, p.Status.IP,
				lastLines(host.Consoles.Log(providers.NameFromUID(string(p.UID))), 1))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s is not Ready after %s: phase %s, ip %q, providerID %q, conditions %+v (err %v)\n%s", ns, name, guestBootTimeout,
				p.Status.Phase, p.Status.IP, p.Status.ProviderID, p.Status.Conditions, err, guestReport(host, ctl, providers.NameFromUID(string(p.UID))))
		}
		time.Sleep(time.Second)
	}
}

// guestReport is what a failing guest test attaches: the guest's serial
// console (the kernel, systemd, cloud-init's output, and the bootstrap's
// Squid status and journal when Squid does not start), the tail of its QEMU
// log, and the controller's last lines.
func guestReport(host *libvirtd.GuestHost, ctl *controllerProc, domain string) string {
	return host.Libvirtd.GuestReport(domain) + "\n--- controller ---\n" + lastLines(ctl.Output(), 60)
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(strings.ReplaceAll(s, "\r", ""), "\n "), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// guestLogin reads the Proxy's generated login from its Secret.
func guestLogin(t *testing.T, c client.Client, p *v1alpha1.Proxy) *providers.BasicAuth {
	t.Helper()
	var s corev1.Secret
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: p.Namespace, Name: credentials.GeneratedSecretName(p)}, &s); err != nil {
		t.Fatalf("the Proxy's generated login: %v", err)
	}
	login, err := credentials.FromSecret(&s)
	if err != nil {
		t.Fatal(err)
	}
	return login
}

// askSquid sends one request straight to a guest's Squid with user info u
// (nil: none), a GET of an absolute URL or a CONNECT to host:port, and
// returns the status.
func askSquid(t *testing.T, squid string, u *url.Userinfo, method, to string) int {
	t.Helper()
	resp, err := testutil.AskProxy(squid, u, method, to, 30*time.Second)
	if err != nil {
		t.Fatalf("%s %s through the guest's Squid: %v", method, to, err)
	}
	return resp.StatusCode
}
