package digitalocean

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/digitalocean/godo"

	"github.com/proxyfleet/proxyfleet/providers"
	"github.com/proxyfleet/proxyfleet/providers/bootstrap"
)

// Tags on every droplet this provider creates. DigitalOcean tags are
// plain names (letters, digits, colons, dashes, underscores), so a
// key and its value are one tag, "key:value".
const (
	// tagPrefix starts every tag of proxyfleet's; operators' tags may not.
	tagPrefix = "proxyfleet"
	// TagManaged marks a droplet as proxyfleet's: ListByTag lists it, and
	// Get treats droplets without it as absent.
	TagManaged = "proxyfleet"
	// TagOwnerUIDPrefix + the owning Proxy's UID: the orphan GC's proof of
	// ownership, and what Create looks a droplet up by.
	TagOwnerUIDPrefix = "proxyfleet-uid:"
	// TagInstallationPrefix + the creating controller's installation ID:
	// the orphan GC deletes only its own installation's droplets.
	TagInstallationPrefix = "proxyfleet-installation:"
	// TagFirewallPrefix + the entry (and installation) names the tag the
	// managed firewall applies to.
	TagFirewallPrefix = "proxyfleet-fw:"
)

// spec is the pure half of Create: what the request resolves to before
// any call.
type spec struct {
	region, size, image string
	tags                []string
	userData            string
	port                int
}

// buildSpec checks req against cfg and resolves its placement, tags and
// user-data, or returns ErrPermanent naming what is wrong. The size has no
// built-in default on purpose: inventing one would start a billable
// droplet of a shape nobody chose. The image has one (DefaultImage).
func buildSpec(cfg Config, req providers.CreateRequest) (spec, error) {
	perm := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", providers.ErrPermanent, fmt.Sprintf(format, args...))
	}
	s := spec{
		region: firstNonEmpty(req.Placement.Zone, cfg.Defaults.Zone, cfg.Region),
		size:   firstNonEmpty(req.Placement.MachineType, cfg.Defaults.MachineType),
		image:  firstNonEmpty(req.Placement.Image, cfg.Defaults.Image, DefaultImage),
		port:   req.Port,
	}
	switch {
	case !regionPattern.MatchString(s.region):
		return spec{}, perm("placement.zone %q is not a region slug (like ams3)", s.region)
	case s.size == "":
		return spec{}, perm("placement.machineType is required: set spec.placement.machineType or the entry's digitalocean.defaults.machineType (a size slug such as s-1vcpu-1gb)")
	case !sizePattern.MatchString(s.size):
		return spec{}, perm("placement.machineType %q is not a size slug (like s-1vcpu-1gb)", s.size)
	case !imagePattern.MatchString(s.image):
		return spec{}, perm("placement.image %q is not an image slug (like debian-12-x64)", s.image)
	case req.Name == "" || len(req.Name) > 63:
		return spec{}, perm("instance name %q is not usable as a droplet name", req.Name)
	case req.OwnerUID == "" || !tagPattern.MatchString(TagOwnerUIDPrefix+req.OwnerUID):
		return spec{}, perm("owner UID %q is not usable in a tag", req.OwnerUID)
	case req.Installation != "" && !tagPattern.MatchString(TagInstallationPrefix+req.Installation):
		return spec{}, perm("installation %q is not usable in a tag", req.Installation)
	case req.Port < 1 || req.Port > 65535:
		return spec{}, perm("port %d is out of range", req.Port)
	}

	tags := map[string]bool{}
	for _, t := range cfg.Tags {
		tags[t] = true
	}
	for _, k := range slices.Sorted(maps.Keys(req.Labels)) {
		t := k + ":" + req.Labels[k]
		if msg := checkTag(t); msg != "" {
			return spec{}, perm("label %s=%q as tag %q: %s", k, req.Labels[k], t, msg)
		}
		tags[t] = true
	}
	tags[TagManaged] = true
	tags[TagOwnerUIDPrefix+req.OwnerUID] = true
	tags[firewallTag(cfg.Entry, req.Installation)] = true
	if req.Installation != "" {
		tags[TagInstallationPrefix+req.Installation] = true
	}
	s.tags = slices.Sorted(maps.Keys(tags))

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
	// DigitalOcean takes at most 64 KiB of user-data.
	if len(userData) > 64<<10 {
		return spec{}, perm("the user-data is %d bytes; DigitalOcean takes at most 65536", len(userData))
	}
	s.userData = string(userData)
	return s, nil
}

// createRequest is the droplet create of s: its name, region, size, image
// by slug, tags and user-data, no backups or monitoring agent, IPv6 when
// the entry asks for it.
func createRequest(cfg Config, name string, s spec) *godo.DropletCreateRequest {
	req := &godo.DropletCreateRequest{
		Name:     name,
		Region:   s.region,
		Size:     s.size,
		Image:    godo.DropletCreateImage{Slug: s.image},
		IPv6:     cfg.IPv6,
		UserData: s.userData,
		Tags:     s.tags,
		VPCUUID:  cfg.VPCUUID,
		// The droplet agent opens the console to DigitalOcean's web
		// terminal; a proxy needs none.
		WithDropletAgent: godo.PtrTo(false),
	}
	for _, k := range cfg.SSHKeys {
		if id, err := strconv.Atoi(k); err == nil {
			req.SSHKeys = append(req.SSHKeys, godo.DropletCreateSSHKey{ID: id})
		} else {
			req.SSHKeys = append(req.SSHKeys, godo.DropletCreateSSHKey{Fingerprint: k})
		}
	}
	return req
}

// firewallTag is the tag the managed firewall of an entry and installation
// applies to: one per pair, so two clusters sharing an account never
// rewrite each other's rules.
func firewallTag(entry, installation string) string {
	t := TagFirewallPrefix + firstNonEmpty(entry, Type)
	if installation != "" {
		t += ":" + installation
	}
	return t
}

// tagValue returns the rest of the first tag starting with prefix.
func tagValue(tags []string, prefix string) string {
	for _, t := range tags {
		if v, ok := strings.CutPrefix(t, prefix); ok {
			return v
		}
	}
	return ""
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
