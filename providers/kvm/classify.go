package kvm

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"regexp"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/proxyfleet/proxyfleet/providers"
)

var (
	identifier = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	domainName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// libvirtCode returns the libvirt error number err carries, if it came from
// the daemon (and not from the transport).
func libvirtCode(err error) (libvirt.ErrorNumber, bool) {
	var le libvirt.Error
	if errors.As(err, &le) {
		return libvirt.ErrorNumber(le.Code), true
	}
	var lp *libvirt.Error
	if errors.As(err, &lp) && lp != nil {
		return libvirt.ErrorNumber(lp.Code), true
	}
	return 0, false
}

// isCode reports whether err is a libvirt error with one of codes.
func isCode(err error, codes ...libvirt.ErrorNumber) bool {
	c, ok := libvirtCode(err)
	if !ok {
		return false
	}
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}

// hasSentinel reports whether err already carries a verdict of the taxonomy.
func hasSentinel(err error) bool {
	return errors.Is(err, providers.ErrTransient) || errors.Is(err, providers.ErrPermanent) ||
		errors.Is(err, providers.ErrQuotaExceeded) || errors.Is(err, providers.ErrNotFound)
}

// permanentCodes are libvirt answers that the same call will get again until
// a human changes the config, the host or the image.
var permanentCodes = map[libvirt.ErrorNumber]bool{
	libvirt.ErrNoSupport: true, libvirt.ErrInvalidArg: true, libvirt.ErrXMLError: true,
	libvirt.ErrXMLDetail: true, libvirt.ErrXMLInvalidSchema: true, libvirt.ErrConfigUnsupported: true,
	libvirt.ErrArgumentUnsupported: true, libvirt.ErrOperationUnsupported: true, libvirt.ErrOperationDenied: true,
	libvirt.ErrAuthFailed: true, libvirt.ErrAccessDenied: true, libvirt.ErrNoNetwork: true,
	libvirt.ErrNoStoragePool: true, libvirt.ErrCPUIncompatible: true, libvirt.ErrOsType: true,
	libvirt.ErrNoSecurityModel: true,
}

// classify wraps a failed step with exactly one sentinel. An error that
// already carries one keeps it. A libvirt answer maps by its code; anything
// else (a transport failure) is Transient.
func classify(what string, err error) error {
	if err == nil {
		return nil
	}
	if hasSentinel(err) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if c, ok := libvirtCode(err); ok {
		switch {
		case c == libvirt.ErrNoDomain || c == libvirt.ErrNoStorageVol:
			return fmt.Errorf("%w: %s: %w", providers.ErrNotFound, what, err)
		case permanentCodes[c]:
			return fmt.Errorf("%w: %s: %w (libvirt error %d)", providers.ErrPermanent, what, err, c)
		default:
			return fmt.Errorf("%w: %s: %w (libvirt error %d)", providers.ErrTransient, what, err, c)
		}
	}
	return fmt.Errorf("%w: %s: %v", providers.ErrTransient, what, err)
}

// Dial stages, for messages and the health check's reason.
const (
	stageMaterial  = "ssh material"
	stageTCP       = "tcp"
	stageHandshake = "ssh handshake"
	stageSocket    = "libvirt socket"
	stageConnect   = "libvirt connect"
)

// dialError is a failed dial with the stage it failed at; it unwraps to the
// classified cause so Class sees the verdict.
type dialError struct {
	host, stage string
	err         error
}

func (e *dialError) Error() string {
	return "dialing host " + e.host + " (" + e.stage + "): " + e.err.Error()
}
func (e *dialError) Unwrap() error { return e.err }

// classifySSH decides what a failed SSH step means. A key or known_hosts
// file that does not exist may still arrive (an optional Secret mounted
// later): Transient. A key that does not parse, a host key that is unknown
// or differs, or an authentication refusal needs an admin: Permanent. The
// messages never carry key material.
func classifySSH(stage string, err error) error {
	var ke *knownhosts.KeyError
	var re *knownhosts.RevokedError
	var ne net.Error
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %v", providers.ErrTransient, err)
	case errors.As(err, &ke):
		if len(ke.Want) > 0 {
			return fmt.Errorf("%w: the host key does not match known_hosts (possible man-in-the-middle, or the host was reinstalled): %v", providers.ErrPermanent, err)
		}
		return fmt.Errorf("%w: the host key is not in known_hosts: %v", providers.ErrPermanent, err)
	case errors.As(err, &re):
		return fmt.Errorf("%w: the host key is revoked: %v", providers.ErrPermanent, err)
	case strings.Contains(err.Error(), "unable to authenticate"):
		return fmt.Errorf("%w: the host refused the SSH key (is it in authorized_keys?): %v", providers.ErrPermanent, err)
	case errors.As(err, &ne):
		return fmt.Errorf("%w: %v", providers.ErrTransient, err)
	case stage == stageMaterial:
		return fmt.Errorf("%w: %v", providers.ErrPermanent, err)
	}
	return fmt.Errorf("%w: %v", providers.ErrTransient, err)
}
