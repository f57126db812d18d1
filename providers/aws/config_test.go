package aws

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/internal/testkit/ec2api"
	"github.com/proxyfleet/proxyfleet/providers"
)

// parse reads a providers config file that may name this type only.
func parse(yaml string) (providers.Config, error) {
	return providers.ParseConfig([]byte(yaml), map[string]providers.Decoder{Type: providers.DecoderOf(ReadConfig)})
}

func TestReadConfigReadsEveryKey(t *testing.T) {
	cfg, err := parse(`
providers:
  - name: aws-eu
    type: aws
    aws:
      region: eu-west-1
      defaults: {zone: eu-west-1b, machineType: t3.micro, image: ami-0de12a00000000002}
      imageOwners: ["136693071363", amazon]
      subnetID: subnet-0123456789abcdef0
      vpcID: vpc-0123456789abcdef0
      sourceRanges: [203.0.113.0/24, "2001:db8::/32"]
      sshSourceRanges: [192.0.2.10/32]
      addressType: private
      ipv6: true
      tags: {team: crawl}
      hourlyPrice: 0.0104
      credentials: {accessKeyIDFile: /var/run/secrets/aws/id, secretAccessKeyFile: /var/run/secrets/aws/secret}
      endpoint: https://ec2.eu-west-1.amazonaws.com
`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadConfig(cfg.Providers[0])
	want := Config{Region: "eu-west-1", Entry: "aws-eu",
		Defaults:    providers.Placement{Zone: "eu-west-1b", MachineType: "t3.micro", Image: "ami-0de12a00000000002"},
		ImageOwners: []string{"136693071363", "amazon"}, SubnetID: "subnet-0123456789abcdef0", VpcID: "vpc-0123456789abcdef0",
		SourceRanges: []string{"203.0.113.0/24", "2001:db8::/32"}, SSHSourceRanges: []string{"192.0.2.10/32"},
		AddressType: AddressPrivate, IPv6: true, Tags: map[string]string{"team": "crawl"}, HourlyPrice: 0.0104,
		Credentials: &Credentials{AccessKeyIDFile: "/var/run/secrets/aws/id", SecretAccessKeyFile: "/var/run/secrets/aws/secret"},
		Endpoint:    "https://ec2.eu-west-1.amazonaws.com"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadConfig = %+v, %v\nwant %+v", got, err, want)
	}
	minimal, err := parse("providers: [{name: a, type: aws, aws: {region: us-east-1, sourceRanges: [0.0.0.0/0]}}]")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ReadConfig(minimal.Providers[0]); err != nil || got.AddressType != AddressPublic {
		t.Fatalf("minimal block = %+v, %v; want addressType public", got, err)
	}
}

func TestReadConfigRejects(t *testing.T) {
	for _, tt := range []struct {
		name string
		yaml string
		want []string
	}{
		{"unknown key", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], sourceRange: [x]}", []string{"aws.sourceRange: unknown field"}},
		{"unknown key nested", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], credentials: {accessKeyId: x}}", []string{"aws.credentials.accessKeyId: unknown field"}},
		{"the entry name is not a key", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], Entry: x}", []string{"aws.Entry: unknown field"}},
		{"region", "{sourceRanges: [203.0.113.0/24]}", []string{"aws.region is required"}},
		{"bad region", "{region: Ireland, sourceRanges: [203.0.113.0/24]}", []string{`aws.region "Ireland" is not a region`}},
		{"zone of another region", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], defaults: {zone: us-east-1a}}", []string{`aws.defaults.zone "us-east-1a" is not an availability zone of eu-west-1`}},
		{"instance type", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], defaults: {machineType: micro}}", []string{`aws.defaults.machineType "micro" is not an instance type`}},
		{"no ranges, no groups", "{region: eu-west-1}", []string{"aws.sourceRanges is required"}},
		{"ranges and groups", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], securityGroupIDs: [sg-0123456789abcdef0]}", []string{"mutually exclusive"}},
		{"not a CIDR", "{region: eu-west-1, sourceRanges: [203.0.113.7, 203.0.113.7/24], sshSourceRanges: [me]}",
			[]string{`aws.sourceRanges[0] "203.0.113.7" is not a CIDR`, `aws.sourceRanges[1] "203.0.113.7/24" has host bits set (did you mean 203.0.113.0/24?)`, `aws.sshSourceRanges[0] "me" is not a CIDR`}},
		{"subnet without VPC", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], subnetID: subnet-0123456789abcdef0}", []string{"aws.vpcID is required with aws.subnetID"}},
		{"address type", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], addressType: external}", []string{`aws.addressType "external" is not public or private`}},
		{"reserved tag", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], tags: {'aws:team': x}}", []string{"aws.tags[aws:team]: keys starting with aws: are reserved"}},
		{"relative key file", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], credentials: {accessKeyIDFile: id, secretAccessKeyFile: /s}}", []string{`aws.credentials.accessKeyIDFile "id" must be an absolute path`}},
		{"half a key", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], credentials: {accessKeyIDFile: /id}}", []string{"aws.credentials.secretAccessKeyFile is required"}},
		{"noAuth and a key", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], noAuth: true, credentials: {accessKeyIDFile: /id, secretAccessKeyFile: /s}}", []string{"aws.noAuth and aws.credentials are mutually exclusive"}},
		{"endpoint with a login", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], endpoint: 'https://u:p@ec2.example'}", []string{"aws.endpoint is not an http(s) base URL without credentials"}},
		{"negative price", "{region: eu-west-1, sourceRanges: [203.0.113.0/24], hourlyPrice: -1}", []string{"aws.hourlyPrice -1 is negative"}},
		{"every problem at once", "{region: x, addressType: y}", []string{"aws.region \"x\"", "aws.addressType \"y\"", "aws.sourceRanges is required"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse("providers:\n- name: a\n  type: aws\n  aws: " + tt.yaml + "\n")
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestConstructorUsesTheBlocksClientOptions builds a provider as the binary
// does, from the file, against the in-test EC2 API: the endpoint and the
// key files reach the client.
func TestConstructorUsesTheBlocksClientOptions(t *testing.T) {
	srv := ec2api.Start(t, testRegion)
	creds := keyFiles(t, ec2api.DefaultAccessKeyID)
	cfg, err := parse("providers: [{name: aws-eu, type: aws, aws: {region: " + testRegion + ", sourceRanges: [203.0.113.0/24], endpoint: '" + srv.URL +
		"', credentials: {accessKeyIDFile: " + creds.AccessKeyIDFile + ", secretAccessKeyFile: " + creds.SecretAccessKeyFile + "}}}]")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Constructor(context.Background())(cfg.Providers[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.ListByTag(context.Background()); err != nil {
		t.Fatalf("ListByTag through the configured endpoint: %v", err)
	}
	checkSigned(t, srv)
	if n := srv.CallCount(ec2api.DescribeInstances); n != 1 {
		t.Fatalf("DescribeInstances = %d, want 1", n)
	}
}

// FuzzReadConfig: the aws block is outside input. What ParseConfig accepts,
// ReadConfig and New accept too, and every tag and range it accepted is
// one Create and the security group take.
func FuzzReadConfig(f *testing.F) {
	f.Add([]byte("providers: [{name: a, type: aws, aws: {region: eu-west-1, defaults: {zone: eu-west-1a, machineType: t3.micro}, sourceRanges: [203.0.113.0/24]}}]"))
	f.Add([]byte("providers:\n- name: a\n  type: aws\n  aws:\n    region: us-east-1\n    securityGroupIDs: [sg-0123456789abcdef0]\n    subnetID: subnet-0123456789abcdef0\n    tags: {team: crawl}\n    endpoint: http://127.0.0.1:1\n    noAuth: true\n    hourlyPrice: 0.01\n"))
	f.Add([]byte("providers: [{name: a, type: aws, aws: {region: eu-west-1, sourceRanges: ['2001:db8::/32'], sshSourceRanges: [192.0.2.1/32], credentials: {accessKeyIDFile: /a, secretAccessKeyFile: /b}}}]"))
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg, err := parse(string(in))
		if err != nil {
			return
		}
		for _, e := range cfg.Providers {
			got, err := ReadConfig(e)
			if err != nil {
				t.Fatalf("ParseConfig accepted what ReadConfig refuses: %v", err)
			}
			if got.Credentials == nil {
				got.NoAuth = true // never the machine's ambient chain in a fuzz run
			}
			if _, err := New(context.Background(), got); err != nil {
				t.Fatalf("New refuses an accepted entry in %q: %v", in, err)
			}
			for k, v := range got.Tags {
				if checkTag(k, v) != "" {
					t.Fatalf("accepted a tag Create refuses: %s=%q", k, v)
				}
			}
			add, _ := ingressChanges(nil, 3128, got.SourceRanges, got.SSHSourceRanges)
			if len(got.SecurityGroupIDs) == 0 && len(add) == 0 {
				t.Fatalf("accepted source ranges %v that open nothing", got.SourceRanges)
			}
		}
	})
}

// TestWithoutKeyFilesTheAmbientChainSigns: an entry without credentials
// signs with what the SDK's default chain finds; here the environment's
// key (on EKS it would be IRSA's web identity or the node's role).
func TestWithoutKeyFilesTheAmbientChainSigns(t *testing.T) {
	srv := ec2api.Start(t, testRegion)
	dir := t.TempDir()
	t.Setenv("AWS_ACCESS_KEY_ID", ec2api.DefaultAccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", ec2api.DefaultSecretAccessKey)
	t.Setenv("AWS_CONFIG_FILE", dir+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", dir+"/none")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	p, err := New(context.Background(), Config{Region: testRegion, SourceRanges: []string{"203.0.113.0/24"}, Endpoint: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.ListByTag(ctx(t)); err != nil {
		t.Fatalf("ListByTag signed by the ambient chain: %v", err)
	}
	checkSigned(t, srv)
}
