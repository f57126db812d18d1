package aws

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
)

// clientOptions are the EC2 client's options for cfg: the region, the
// endpoint, the credentials (the key files, anonymous for noAuth, else the
// ambient chain resolved once here), and no SDK retries: the reconciler
// already retries with backoff, and a call held in the SDK's own retry loop
// would hold a reconcile worker and hide throttling from the reconciler's
// quota wait. The options hold file paths, never key material.
func clientOptions(ctx context.Context, cfg Config) (ec2.Options, error) {
	opts := ec2.Options{
		Region:  cfg.Region,
		Retryer: awssdk.NopRetryer{},
		// The client's HTTP requests are spans of the provider call that
		// made them, as the gcp provider's are.
		HTTPClient: &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport.(*http.Transport).Clone())},
	}
	switch {
	case cfg.NoAuth:
		opts.Credentials = awssdk.AnonymousCredentials{}
	case cfg.Credentials != nil:
		opts.Credentials = fileCredentials{files: *cfg.Credentials}
	default:
		ambient, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(cfg.Region))
		if err != nil {
			// The message names where the chain looked (a profile, a
			// file), never a key.
			return ec2.Options{}, fmt.Errorf("aws credentials chain: %w", err)
		}
		opts.Credentials = ambient.Credentials
	}
	if cfg.Endpoint != "" {
		opts.BaseEndpoint = awssdk.String(strings.TrimSuffix(cfg.Endpoint, "/"))
	}
	return opts, nil
}

// fileCredentials reads a static access key from files (a mounted Secret)
// on every request: the kubelet rewrites a mounted Secret in place when it
// changes, so a rotated key takes effect on the next call without a
// restart. It is never wrapped in a cache, and its errors name the files,
// never their content.
type fileCredentials struct {
	files Credentials
}

// Retrieve reads the files.
func (f fileCredentials) Retrieve(context.Context) (awssdk.Credentials, error) {
	id, err := readKeyFile(f.files.AccessKeyIDFile)
	if err != nil {
		return awssdk.Credentials{}, err
	}
	secret, err := readKeyFile(f.files.SecretAccessKeyFile)
	if err != nil {
		return awssdk.Credentials{}, err
	}
	var token string
	if f.files.SessionTokenFile != "" {
		if token, err = readKeyFile(f.files.SessionTokenFile); err != nil {
			return awssdk.Credentials{}, err
		}
	}
	return awssdk.Credentials{AccessKeyID: id, SecretAccessKey: secret, SessionToken: token, Source: "proxyfleet key files"}, nil
}

// errKeyFile marks a credentials file that cannot be used; the request
// was never sent. classify calls a missing file Transient (an optional
// Secret may be mounted later, as the kvm provider's SSH key may) and an
// empty or unreadable one Permanent.
var errKeyFile = errors.New("aws credentials file")

func readKeyFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errKeyFile, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("%w %s is empty", errKeyFile, path)
	}
	return v, nil
}
