package hetzner

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
)

// Labels on every server (and the managed firewall) this provider creates.
const (
	// labelPrefix starts every label key of proxyfleet's; operators'
	// labels may not.
	labelPrefix = "proxyfleet.io/"
	// LabelManagedBy with value ManagedBy marks a server as proxyfleet's:
	// ListByTag selects on it, and Get treats servers without it as absent.
	LabelManagedBy = "proxyfleet.io/managed-by"
	// ManagedBy is LabelManagedBy's value.
	ManagedBy = "proxyfleet"
	// LabelOwnerUID carries the owning Proxy's UID: the orphan GC's proof
	// of ownership, and what Create checks a server of its name against.
	LabelOwnerUID = "proxyfleet.io/proxy-uid"
	// LabelInstallation carries the creating controller's installation ID.
	LabelInstallation = "proxyfleet.io/installation"
	// LabelProxyNamespace and LabelProxyName carry the owning Proxy, for
	// humans (a label value cannot hold "namespace/name").
	LabelProxyNamespace = "proxyfleet.io/proxy-namespace"
	LabelProxyName      = "proxyfleet.io/proxy-name"
	// LabelEntry carries the providers config entry on the managed
	// firewall.
	LabelEntry = "proxyfleet.io/entry"
)

// spec is the pure half of Create: what the request resolves to before
// any call.
type spec struct {
	location, serverType, image string
	labels                      map[string]string
	userData                    string
	port                        int
}

// buildSpec checks req against cfg and resolves its placement, labels and
// user-data, or returns ErrPermanent naming what is wrong. The server type
// has no built-in default on purpose: inventing one would start a billable
// server of a shape nobody chose. The image has one (DefaultImage).
func buildSpec(cfg Config, req providers.CreateRequest) (spec, error) {
	perm := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", providers.ErrPermanent, fmt.Sprintf(format, args...))
	}
	s := spec{
		location:   firstNonEmpty(req.Placement.Zone, cfg.Defaults.Zone, cfg.Location),
		serverType: firstNonEmpty(req.Placement.MachineType, cfg.Defaults.MachineType),
		image:      firstNonEmpty(req.Placement.Image, cfg.Defaults.Image, DefaultImage),
		port:       req.Port,
	}
	switch {
	case !locationPattern.MatchString(s.location):
		return spec{}, perm("placement.zone %q is not a location (like fsn1)", s.location)
	case s.serverType == "":
		return spec{}, perm("placement.machineType is required: set spec.placement.machineType or the entry's hetzner.defaults.machineType (a server type such as cx22)")
	case !serverTypePattern.MatchString(s.serverType):
		return spec{}, perm("placement.machineType %q is not a server type (like cx22)", s.serverType)
	case !imagePattern.MatchString(s.image):
		return spec{}, perm("placement.image %q is not an image name (like debian-12)", s.image)
	case req.Name == "" || len(req.Name) > 63:
		return spec{}, perm("instance name %q is not usable as a server name", req.Name)
	case !labelValuePattern.MatchString(req.OwnerUID) || req.OwnerUID == "":
		return spec{}, perm("owner UID %q is not usable as a label value", req.OwnerUID)
	case !labelValuePattern.MatchString(req.Installation):
		return spec{}, perm("installation %q is not usable as a label value", req.Installation)
	case req.Port < 1 || req.Port > 65535:
		return spec{}, perm("port %d is out of range", req.Port)
	}

	s.labels = map[string]string{}
	for _, src := range []map[string]string{cfg.Labels, req.Labels} {
		for _, k := range slices.Sorted(maps.Keys(src)) {
			if strings.HasPrefix(k, labelPrefix) {
				continue // proxyfleet's own keys win
			}
			if msg := checkLabel(k, src[k]); msg != "" {
				return spec{}, perm("label %s=%q: %s", k, src[k], msg)
			}
			s.labels[k] = src[k]
		}
	}
	s.labels[LabelManagedBy] = ManagedBy
	s.labels[LabelOwnerUID] = req.OwnerUID
	if req.Installation != "" {
		s.labels[LabelInstallation] = req.Installation
	}
	// The Proxy's names are for humans: set only when they are label
	// values (a Proxy name may hold dots, which labels take, and is at
	// most 63 characters only for DNS-1123 labels).
	if labelValuePattern.MatchString(req.OwnerNamespace) && labelValuePattern.MatchString(req.OwnerName) && req.OwnerName != "" {
		s.labels[LabelProxyNamespace], s.labels[LabelProxyName] = req.OwnerNamespace, req.OwnerName
	}

	userData := req.CloudInit
	if len(userData) == 0 {
		if req.ProxyAuth == nil || req.ProxyAuth.Username == "" || req.ProxyAuth.Password == "" {
			return spec{}, perm("the proxyfleet bootstrap needs proxy credentials and none were given (refusing to boot an open proxy)")
		}
		ud, err := bootstrap.Squid(req.Name, req.Port, *req.ProxyAuth)
		if err != nil {
			return spec{}, perm("building the bootstrap cloud-init: %v", err)
		}
		userData = ud
	}
	// Hetzner takes at most 32 KiB of user-data.
	if len(userData) > 32<<10 {
		return spec{}, perm("the user-data is %d bytes; Hetzner takes at most 32768", len(userData))
	}
	s.userData = string(userData)
	return s, nil
}

// createOpts is the server create of s: its name, type, image and
// location by name, labels, user-data, the managed firewall applied from
// the start, public IPv6 always and IPv4 unless the entry is IPv6-only.
func createOpts(cfg Config, name string, s spec, firewall int64) hcloud.ServerCreateOpts {
	opts := hcloud.ServerCreateOpts{
		Name:             name,
		ServerType:       &hcloud.ServerType{Name: s.serverType},
		Image:            &hcloud.Image{Name: s.image},
		Location:         &hcloud.Location{Name: s.location},
		UserData:         s.userData,
		Labels:           s.labels,
		StartAfterCreate: hcloud.Ptr(true),
		PublicNet:        &hcloud.ServerCreatePublicNet{EnableIPv4: !cfg.IPv6Only, EnableIPv6: true},
		Firewalls:        []*hcloud.ServerCreateFirewall{{Firewall: hcloud.Firewall{ID: firewall}}},
	}
	for _, id := range cfg.SSHKeys {
		opts.SSHKeys = append(opts.SSHKeys, &hcloud.SSHKey{ID: id})
	}
	return opts
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
