package gcp

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
)

var (
	zonePattern = regexp.MustCompile(`^[a-z]+-[a-z]+[0-9]+-[a-z]$`)
	// namePattern is Compute Engine's resource name syntax (RFC 1035 label).
	namePattern = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// buildInstance is the pure half of Create: the instance resource and its
// zone, or ErrPermanent naming what is wrong with req. Zone, machine type and
// image have no built-in defaults on purpose: inventing one would create a
// billable VM of a shape nobody chose.
func buildInstance(cfg Config, req providers.CreateRequest) (*computepb.Instance, string, error) {
	perm := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", providers.ErrPermanent, fmt.Sprintf(format, args...))
	}
	zone := firstNonEmpty(req.Placement.Zone, cfg.Defaults.Zone)
	machineType := firstNonEmpty(req.Placement.MachineType, cfg.Defaults.MachineType)
	image := firstNonEmpty(req.Placement.Image, cfg.Defaults.Image)
	switch {
	case zone == "":
		return nil, "", perm("placement.zone is required: set spec.placement.zone or the entry's gcp.defaults.zone")
	case !zonePattern.MatchString(zone):
		return nil, "", perm("placement.zone %q is not a zone (like europe-west1-b)", zone)
	case machineType == "":
		return nil, "", perm("placement.machineType is required: set spec.placement.machineType or the entry's gcp.defaults.machineType")
	case image == "":
		return nil, "", perm("placement.image is required: set spec.placement.image or the entry's gcp.defaults.image")
	case strings.ContainsAny(machineType+image, " \t\n"):
		return nil, "", perm("placement.machineType and placement.image must not contain whitespace")
	case !namePattern.MatchString(req.Name):
		return nil, "", perm("instance name %q is not a Compute Engine name", req.Name)
	case req.OwnerUID == "" || !labelValue.MatchString(req.OwnerUID):
		return nil, "", perm("owner UID %q is not usable as a label value", req.OwnerUID)
	case req.Installation != "" && !labelValue.MatchString(req.Installation):
		return nil, "", perm("installation %q is not usable as a label value", req.Installation)
	case req.Port < 1 || req.Port > 65535:
		return nil, "", perm("port %d is out of range", req.Port)
	}
	if !strings.Contains(machineType, "/") {
		machineType = "zones/" + zone + "/machineTypes/" + machineType
	}

	labels := map[string]string{}
	for _, src := range []map[string]string{cfg.Labels, req.Labels} {
		for _, k := range slices.Sorted(maps.Keys(src)) {
			v := src[k]
			if !labelKey.MatchString(k) || !labelValue.MatchString(v) {
				return nil, "", perm("label %s=%q is not a valid GCP label (lower-case letters, digits, _ and -)", k, v)
			}
			labels[k] = v
		}
	}
	labels[LabelManagedBy] = ManagedBy
	labels[LabelOwnerUID] = req.OwnerUID
	delete(labels, LabelInstallation)
	if req.Installation != "" {
		labels[LabelInstallation] = req.Installation
	}
	delete(labels, LabelOwnerName)
	if n := req.OwnerName; n != "" && labelValue.MatchString(n) {
		labels[LabelOwnerName] = n
	}

	userData := req.CloudInit
	if len(userData) == 0 {
		if req.ProxyAuth == nil || req.ProxyAuth.Username == "" || req.ProxyAuth.Password == "" {
			return nil, "", perm("the proxyfleet bootstrap needs proxy credentials and none were given (refusing to boot an open proxy)")
		}
		ud, err := bootstrap.Squid(req.Name, req.Port, *req.ProxyAuth)
		if err != nil {
			return nil, "", perm("building the bootstrap cloud-init: %v", err)
		}
		userData = ud
	}

	ins := &computepb.Instance{
		Name:        proto.String(req.Name),
		Description: proto.String(fmt.Sprintf("proxyfleet upstream proxy for Proxy %s/%s", req.OwnerNamespace, req.OwnerName)),
		MachineType: proto.String(machineType),
		Labels:      labels,
		Disks: []*computepb.AttachedDisk{{
			Boot:       proto.Bool(true),
			AutoDelete: proto.Bool(true),
			Type:       proto.String(computepb.AttachedDisk_PERSISTENT.String()),
			InitializeParams: &computepb.AttachedDiskInitializeParams{
				SourceImage: proto.String(image),
			},
		}},
		NetworkInterfaces: []*computepb.NetworkInterface{networkInterface(cfg)},
		Metadata: &computepb.Metadata{Items: []*computepb.Items{{
			Key: proto.String(userDataKey), Value: proto.String(string(userData)),
		}}},
	}
	if len(cfg.NetworkTags) > 0 {
		ins.Tags = &computepb.Tags{Items: append([]string(nil), cfg.NetworkTags...)}
	}
	if cfg.ServiceAccount != "" {
		ins.ServiceAccounts = []*computepb.ServiceAccount{{
			Email:  proto.String(cfg.ServiceAccount),
			Scopes: []string{"https://www.googleapis.com/auth/cloud-platform"},
		}}
	}
	return ins, zone, nil
}

// networkInterface is the VM's one interface: the entry's network and
// subnetwork, and a one-to-one NAT for an external address.
func networkInterface(cfg Config) *computepb.NetworkInterface {
	nic := &computepb.NetworkInterface{}
	if cfg.Network != "" {
		nic.Network = proto.String(cfg.Network)
	}
	if cfg.Subnetwork != "" {
		nic.Subnetwork = proto.String(cfg.Subnetwork)
	}
	if cfg.AddressType == AddressExternal {
		nic.AccessConfigs = []*computepb.AccessConfig{{
			Name: proto.String("external-nat"),
			Type: proto.String(computepb.AccessConfig_ONE_TO_ONE_NAT.String()),
		}}
	}
	return nic
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
