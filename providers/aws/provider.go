// Package aws is the provider that runs each upstream proxy as an EC2
// instance: one instance per Proxy, so every Proxy has an egress address of
// its own, which is what the fleet exists for.
//
// Create is RunInstances with the Proxy's UID as the ClientToken, so a
// Create retried after a lost answer or a controller restart gets the
// instance the first attempt made instead of a second one; it returns once
// EC2 accepted the launch, and the reconciler finds readiness by polling
// Get, as for every provider. An instance booted with the provider's own
// cloud-init runs a Squid that demands the per-Proxy login the controller
// generated, behind a security group that admits the proxy port from the
// gateways' ranges only, so an instance on a public address is never an
// open proxy.
//
// It owns its block of the providers config file (config.go: Type,
// ReadConfig), which the binary's composition root wires to the type name.
// It imports the providers contract and providers/bootstrap, never another
// provider, the controller or cmd.
package aws

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/proxyfleet/proxyfleet/providers"
)

// Constructor returns the registry constructor for type aws. ctx bounds
// the ambient credential chain's first lookup; it is the controller's root
// context.
func Constructor(ctx context.Context) providers.Constructor {
	return func(e providers.Entry) (providers.Provider, error) {
		cfg, err := ReadConfig(e)
		if err != nil {
			return nil, err
		}
		return New(ctx, cfg)
	}
}

// Provider runs Squid instances in one region. It is safe for concurrent
// use; it keeps no state beyond its configuration and client.
type Provider struct {
	client *ec2.Client
	// opts are the client's options, from which Check makes a client of
	// its own.
	opts ec2.Options
	cfg  Config
}

var (
	_ providers.Provider         = (*Provider)(nil)
	_ providers.Checker          = (*Provider)(nil)
	_ providers.AuthBootstrapper = (*Provider)(nil)
)

// New returns a provider launching instances in cfg.Region, with the
// client cfg describes (clientOptions).
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if cfg.Region == "" {
		return nil, errors.New("aws provider: region is required")
	}
	if cfg.AddressType == "" {
		cfg.AddressType = AddressPublic
	}
	if problems := append(cfg.validatePlacement(), cfg.validateAccess()...); len(problems) > 0 {
		return nil, fmt.Errorf("aws provider: %w", providers.Problems(problems))
	}
	opts, err := clientOptions(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Provider{client: ec2.New(opts), opts: opts, cfg: cfg}, nil
}

// BootstrapRequiresAuth is true: the instance's Squid is reachable from
// outside the cluster, so the bootstrap always demands per-Proxy
// credentials.
func (p *Provider) BootstrapRequiresAuth() bool { return true }

// HourlyPrice is the entry's configured price of one instance for an hour,
// 0 when none is configured.
func (p *Provider) HourlyPrice() float64 { return p.cfg.HourlyPrice }

// maxTokens bounds how many terminated instances of one Proxy Create steps
// over before it gives up: each replacement of a Proxy's instance (it was
// stopped, or its spec changed) uses the next client token.
const maxTokens = 100

// Create launches the instance for req and returns without waiting for it
// to run. The launch is RunInstances with the client token
// clientToken(UID, k): EC2 answers a token it has seen with the instance it
// made then, so a Create whose answer was lost (a 500, a timeout, a
// controller restart) finds its instance on the retry and never makes a
// second one. A token whose instance has been terminated since (the
// reconciler replaces a stopped instance under the same UID) is answered
// IdempotentInstanceTerminated, and Create moves on to the next k; the
// sequence is the same on every attempt, so a retry walks to the same
// token again. The managed security group is brought up to date first, and
// an image name filter is resolved to the newest matching AMI.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (providers.Instance, error) {
	s, err := buildSpec(p.cfg, req)
	if err != nil {
		return providers.Instance{}, err
	}
	groups, managedGroup, err := p.securityGroups(ctx, req)
	if err != nil {
		return providers.Instance{}, err
	}
	image, err := p.resolveImage(ctx, s.image)
	if err != nil {
		return providers.Instance{}, err
	}
	for k := range maxTokens {
		token := clientToken(req.OwnerUID, k)
		out, err := p.client.RunInstances(ctx, runInput(p.cfg, s, image, groups, token))
		switch code := errorCode(err); {
		case code == "IdempotentInstanceTerminated":
			continue
		case code == "IdempotentParameterMismatch":
			// An earlier attempt with this token launched with other
			// parameters (a name filter now resolves to a newer image):
			// that instance is this Proxy's all the same.
			inst, live, err := p.byToken(ctx, token)
			switch {
			case err != nil:
				return providers.Instance{}, err
			case !live:
				continue
			}
			return p.owned(inst, req)
		case code == "InvalidGroup.NotFound" && managedGroup:
			return providers.Instance{}, fmt.Errorf("%w: the managed security group, seen a moment ago, is not visible to RunInstances yet: %w", providers.ErrTransient, err)
		case err != nil:
			return providers.Instance{}, classify("launching instance "+req.Name, err)
		}
		if len(out.Instances) != 1 {
			return providers.Instance{}, fmt.Errorf("%w: RunInstances answered %d instances, want 1", providers.ErrTransient, len(out.Instances))
		}
		ins := out.Instances[0]
		if gone(ins.State) {
			continue
		}
		return p.owned(ins, req)
	}
	return providers.Instance{}, fmt.Errorf("%w: Proxy UID %s has had %d instances terminated; delete and recreate the Proxy", providers.ErrPermanent, req.OwnerUID, maxTokens)
}

// owned returns ins as the instance of req, or ErrPermanent when it is not
// tagged as req's (a client token is only ever a Proxy's UID, so this is a
// guard against tags edited by hand, never expected).
func (p *Provider) owned(ins types.Instance, req providers.CreateRequest) (providers.Instance, error) {
	tags := tagMap(ins.Tags)
	if tags[TagManagedBy] != ManagedBy || tags[TagOwnerUID] != req.OwnerUID {
		return providers.Instance{}, fmt.Errorf("%w: instance %s answering client token of Proxy UID %s is tagged for UID %q; refusing to adopt it",
			providers.ErrPermanent, awssdk.ToString(ins.InstanceId), req.OwnerUID, tags[TagOwnerUID])
	}
	return p.instanceOf(ins), nil
}

// byToken finds the instance launched with token; live is false when there
// is none or it is terminated.
func (p *Provider) byToken(ctx context.Context, token string) (ins types.Instance, live bool, err error) {
	out, err := p.client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{
		Filters: []types.Filter{{Name: awssdk.String("client-token"), Values: []string{token}}},
	})
	if err != nil {
		return types.Instance{}, false, classify("looking up the instance of client token "+token, err)
	}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if !gone(in.State) {
				return in, true, nil
			}
		}
	}
	return types.Instance{}, false, nil
}

// image is the AMI an instance boots and its root volume's device name.
type image struct {
	id, rootDevice string
}

// resolveImage looks ref up: the AMI it names, or the newest available
// image whose name matches the filter ref among the configured owners'.
// An AMI ID is described too, for its root device name (so the launch can
// make the root volume go with the instance whatever the AMI says) and to
// refuse one that does not exist before anything is launched.
func (p *Provider) resolveImage(ctx context.Context, ref string) (image, error) {
	in := &ec2.DescribeImagesInput{ImageIds: []string{ref}}
	owners := p.cfg.ImageOwners
	if len(owners) == 0 {
		owners = []string{DebianOwner}
	}
	if !amiPattern.MatchString(ref) {
		in = &ec2.DescribeImagesInput{Owners: owners, Filters: []types.Filter{
			{Name: awssdk.String("name"), Values: []string{ref}},
			{Name: awssdk.String("state"), Values: []string{"available"}},
		}}
	}
	out, err := p.client.DescribeImages(ctx, in)
	if err != nil {
		return image{}, classify("looking up image "+ref, err)
	}
	switch {
	case len(out.Images) == 0 && amiPattern.MatchString(ref):
		return image{}, fmt.Errorf("%w: image %s does not exist in %s", providers.ErrPermanent, ref, p.cfg.Region)
	case len(out.Images) == 0:
		return image{}, fmt.Errorf("%w: no available image named %q owned by %s in %s", providers.ErrPermanent, ref, strings.Join(owners, ", "), p.cfg.Region)
	}
	imgs := out.Images
	sort.Slice(imgs, func(i, j int) bool {
		a, b := awssdk.ToString(imgs[i].CreationDate), awssdk.ToString(imgs[j].CreationDate)
		if a != b {
			return a > b // RFC 3339 in UTC sorts as text
		}
		return awssdk.ToString(imgs[i].ImageId) < awssdk.ToString(imgs[j].ImageId)
	})
	return image{id: awssdk.ToString(imgs[0].ImageId), rootDevice: awssdk.ToString(imgs[0].RootDeviceName)}, nil
}

// Get observes the instance providerID names. A missing or terminated
// instance, or one not managed by proxyfleet, is ErrNotFound.
func (p *Provider) Get(ctx context.Context, providerID string) (providers.Instance, error) {
	_, id, err := parseProviderID(providerID)
	if err != nil {
		return providers.Instance{}, err
	}
	out, err := p.client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		return providers.Instance{}, classify("describing instance "+providerID, err)
	}
	for _, r := range out.Reservations {
		for _, ins := range r.Instances {
			switch {
			case awssdk.ToString(ins.InstanceId) != id:
				continue
			case tagMap(ins.Tags)[TagManagedBy] != ManagedBy:
				return providers.Instance{}, fmt.Errorf("%w: instance %s is not managed by proxyfleet", providers.ErrNotFound, providerID)
			case ins.State != nil && ins.State.Name == types.InstanceStateNameTerminated:
				return providers.Instance{}, fmt.Errorf("%w: instance %s is terminated", providers.ErrNotFound, providerID)
			}
			return p.instanceOf(ins), nil
		}
	}
	return providers.Instance{}, fmt.Errorf("%w: instance %s is not in the answer", providers.ErrNotFound, providerID)
}

// Delete terminates the instance and returns without waiting. An instance
// EC2 no longer knows is success (deletion is retried, and the GC may have
// won the race); terminating one already shutting down or terminated is
// success in EC2 itself.
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	_, id, err := parseProviderID(providerID)
	if err != nil {
		return err
	}
	_, err = p.client.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
	if err == nil {
		return nil
	}
	c := classify("terminating instance "+providerID, err)
	if errors.Is(c, providers.ErrNotFound) {
		return nil
	}
	return c
}

// liveStates are every state but terminated: what ListByTag asks for.
var liveStates = []string{"pending", "running", "shutting-down", "stopping", "stopped"}

// managedFilters select proxyfleet's instances that still exist.
func managedFilters() []types.Filter {
	return []types.Filter{
		{Name: awssdk.String("tag:" + TagManagedBy), Values: []string{ManagedBy}},
		{Name: awssdk.String("instance-state-name"), Values: liveStates},
	}
}

// ListByTag lists every proxyfleet instance in the region that is not
// terminated, in every zone and not only the configured one, following
// every page. Any error fails the whole list.
func (p *Provider) ListByTag(ctx context.Context) ([]providers.Instance, error) {
	in := &ec2.DescribeInstancesInput{Filters: managedFilters(), MaxResults: awssdk.Int32(1000)}
	var out []providers.Instance
	for {
		page, err := p.client.DescribeInstances(ctx, in)
		if err != nil {
			return nil, classify("listing managed instances", err)
		}
		for _, r := range page.Reservations {
			for _, ins := range r.Instances {
				if tagMap(ins.Tags)[TagManagedBy] != ManagedBy || ins.State != nil && ins.State.Name == types.InstanceStateNameTerminated {
					continue // the filters already exclude these; never trust a list blindly
				}
				inst := p.instanceOf(ins)
				inst.Parts = []string{providers.PartVM}
				out = append(out, inst)
			}
		}
		if awssdk.ToString(page.NextToken) == "" {
			return out, nil
		}
		in.NextToken = page.NextToken
	}
}

// Check describes at most five managed instances (EC2's smallest page) on a
// client and connection of its own, so a pooled connection that still
// works cannot hide an endpoint that stopped answering: that proves the
// credentials, the region and the permission ListByTag and the GC rely
// on. One target per entry: the region.
func (p *Provider) Check(ctx context.Context) []providers.TargetStatus {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	defer transport.CloseIdleConnections()
	c := ec2.New(p.opts, func(o *ec2.Options) { o.HTTPClient = &http.Client{Transport: transport} })
	_, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: managedFilters(), MaxResults: awssdk.Int32(5)})
	st := providers.TargetStatus{Target: p.cfg.Region, Details: map[string]string{"region": p.cfg.Region, "addressType": p.cfg.AddressType}}
	if z := p.cfg.Defaults.Zone; z != "" {
		st.Details["defaultZone"] = z
	}
	st.Ready, st.Reason, st.Message = checkVerdict(err)
	return []providers.TargetStatus{st}
}

// instanceOf maps an instance onto the contract: the state from EC2's,
// the address of the configured type once it has one.
func (p *Provider) instanceOf(ins types.Instance) providers.Instance {
	tags := tagMap(ins.Tags)
	zone := ""
	if ins.Placement != nil {
		zone = awssdk.ToString(ins.Placement.AvailabilityZone)
	}
	out := providers.Instance{
		ProviderID:   formatProviderID(zone, awssdk.ToString(ins.InstanceId)),
		Name:         tags[TagName],
		OwnerUID:     tags[TagOwnerUID],
		Installation: tags[TagInstallation],
		CreatedAt:    awssdk.ToTime(ins.LaunchTime),
	}
	ip := addressOf(ins, p.cfg.AddressType)
	var state types.InstanceStateName
	if ins.State != nil {
		state = ins.State.Name
	}
	out.State = stateOf(state, ip != "")
	if out.State == providers.StateRunning {
		out.IP = ip
	}
	return out
}

// addressOf is the instance's public IPv4 address, or its IPv6 address when
// it has no public IPv4 (public), or its private IPv4 address (private); ""
// while it has none.
func addressOf(ins types.Instance, addressType string) string {
	if addressType == AddressPrivate {
		return awssdk.ToString(ins.PrivateIpAddress)
	}
	if ip := awssdk.ToString(ins.PublicIpAddress); ip != "" {
		return ip
	}
	if ip := awssdk.ToString(ins.Ipv6Address); ip != "" {
		return ip
	}
	for _, nic := range ins.NetworkInterfaces {
		for _, a := range nic.Ipv6Addresses {
			if ip := awssdk.ToString(a.Ipv6Address); ip != "" {
				return ip
			}
		}
	}
	return ""
}

// stateOf maps an EC2 instance state. Running without the chosen address
// is still provisioning (the gateways cannot reach it yet); shutting-down
// is Terminated (the reconciler waits for it to go); terminated never
// reaches here (Get calls it NotFound). Unknown states are Stopped: the
// reconciler deletes and recreates, the safe move for cattle when the API
// grows a state this code has never seen.
func stateOf(state types.InstanceStateName, hasAddress bool) providers.State {
	switch state {
	case types.InstanceStateNameRunning:
		if hasAddress {
			return providers.StateRunning
		}
		return providers.StateProvisioning
	case types.InstanceStateNamePending:
		return providers.StateProvisioning
	case types.InstanceStateNameShuttingDown, types.InstanceStateNameTerminated:
		return providers.StateTerminated
	default:
		return providers.StateStopped
	}
}

// gone reports an instance that is terminated or on its way there.
func gone(s *types.InstanceState) bool {
	return s != nil && (s.Name == types.InstanceStateNameTerminated || s.Name == types.InstanceStateNameShuttingDown)
}

// providerIDPrefix starts every providerID, as Kubernetes' AWS cloud
// provider spells a node's: aws:///<zone>/<instance-id>.
const providerIDPrefix = "aws:///"

var instanceIDPattern = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)

// formatProviderID returns "aws:///<zone>/<instance-id>".
func formatProviderID(zone, id string) string {
	return providerIDPrefix + zone + "/" + id
}

// parseProviderID parses "aws:///<zone>/<instance-id>" strictly. Anything
// else is ErrPermanent, since retrying cannot make it parse.
func parseProviderID(id string) (zone, instanceID string, err error) {
	rest, ok := strings.CutPrefix(id, providerIDPrefix)
	zone, instanceID, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || !zonePattern.MatchString(zone) || !instanceIDPattern.MatchString(instanceID) {
		return "", "", fmt.Errorf("%w: invalid providerID %q: want aws:///<zone>/<instance-id>", providers.ErrPermanent, id)
	}
	return zone, instanceID, nil
}
