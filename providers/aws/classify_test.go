package aws

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/providers"
)

// TestUnknownRegionIsPermanent: EC2's endpoint for a region that does not
// exist, ec2.<region>.amazonaws.com, has no DNS name. The provider tests
// never resolve a public name, so the resolver's answer is built here.
func TestUnknownRegionIsPermanent(t *testing.T) {
	nx := fmt.Errorf("operation error EC2: DescribeInstances, https response error: %w",
		&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "ec2.eu-nowhere-1.amazonaws.com", IsNotFound: true}})
	err := classify("describing instance x", nx)
	if !errors.Is(err, providers.ErrPermanent) || !strings.Contains(err.Error(), "is the region or endpoint right?") {
		t.Fatalf("classify(NXDOMAIN) = %v, want Permanent naming the region", err)
	}
	timeout := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "i/o timeout", Name: "ec2.eu-west-1.amazonaws.com", IsTimeout: true}}
	if got := classify("x", timeout); !errors.Is(got, providers.ErrTransient) {
		t.Fatalf("classify(DNS timeout) = %v, want Transient", got)
	}
}

func TestKeyFileErrorsAreClassified(t *testing.T) {
	missing := fmt.Errorf("%w: %w", errKeyFile, &os.PathError{Op: "open", Path: "/k", Err: os.ErrNotExist})
	if got := classify("x", missing); !errors.Is(got, providers.ErrTransient) {
		t.Fatalf("missing key file: %v, want Transient", got)
	}
	empty := fmt.Errorf("%w /k is empty", errKeyFile)
	if got := classify("x", empty); !errors.Is(got, providers.ErrPermanent) {
		t.Fatalf("empty key file: %v, want Permanent", got)
	}
}
