// Package ec2api is an in-test Amazon EC2 API: the eight Query-protocol
// actions the aws provider calls (RunInstances, DescribeInstances,
// TerminateInstances, DescribeImages, DescribeSecurityGroups,
// CreateSecurityGroup, AuthorizeSecurityGroupIngress,
// RevokeSecurityGroupIngress), answering form-encoded POSTs with EC2's XML
// shapes and error bodies, for the real aws-sdk-go-v2 client to talk to
// through its BaseEndpoint. It keeps RunInstances' ClientToken promise (a
// repeated token answers the instance it made, or
// IdempotentInstanceTerminated once that instance is gone), checks every
// request's SigV4 signature against the known access keys, fails and hangs
// on cue, and records every call.
//
// It imports the standard library and cloudfault (the fault script every
// in-test cloud shares) only: nothing else of ours (never the aws
// provider it stands in for) and no AWS library, so a test links the
// cloud's client only through the code under test.
package ec2api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/cloudfault"
)

// Actions, for Fail and CallCount.
const (
	RunInstances                  = "RunInstances"
	DescribeInstances             = "DescribeInstances"
	TerminateInstances            = "TerminateInstances"
	DescribeImages                = "DescribeImages"
	DescribeSecurityGroups        = "DescribeSecurityGroups"
	CreateSecurityGroup           = "CreateSecurityGroup"
	AuthorizeSecurityGroupIngress = "AuthorizeSecurityGroupIngress"
	RevokeSecurityGroupIngress    = "RevokeSecurityGroupIngress"
)

// Instance states as EC2 names them.
const (
	StatePending      = "pending"
	StateRunning      = "running"
	StateStopping     = "stopping"
	StateStopped      = "stopped"
	StateShuttingDown = "shutting-down"
	StateTerminated   = "terminated"
)

var stateCodes = map[string]int{StatePending: 0, StateRunning: 16, StateShuttingDown: 32, StateTerminated: 48, StateStopping: 64, StateStopped: 80}

// Error is one EC2 error answer.
type Error struct {
	// Status is the HTTP status (400 for most client errors, 401 for
	// AuthFailure, 503 for RequestLimitExceeded, 500 for InternalError).
	Status  int
	Code    string
	Message string
}

// Instance is one stored instance.
type Instance struct {
	ID, Type, ImageID, Zone string
	State                   string
	PublicIP, PrivateIP     string
	IPv6                    string
	SubnetID, VpcID         string
	SecurityGroups          []string
	AssociatePublicIP       string // "true", "false" or "" as requested
	IPv6AddressCount        int
	Tags                    map[string]string
	// VolumeTags and NICTags are the request's tags for the instance's
	// volumes and network interfaces.
	VolumeTags, NICTags map[string]string
	// RootDevice and RootDeleteOnTermination are the request's block
	// device mapping of the root volume ("" when it sent none).
	RootDevice, RootDeleteOnTermination string
	// UserData is the decoded user-data.
	UserData    string
	ClientToken string
	LaunchTime  time.Time
}

// Image is one image DescribeImages knows.
type Image struct {
	ID, Name, Owner, Architecture string
	Created                       time.Time
	// RootDevice is the root volume's device name; /dev/xvda when empty.
	RootDevice string
}

// Permission is one ingress rule of a security group: a protocol, a port
// range and the source ranges it admits.
type Permission struct {
	Protocol         string
	FromPort, ToPort int
	CIDRs, IPv6CIDRs []string
	// Groups are source security groups (rules that admit another group).
	Groups []string
}

// SecurityGroup is one stored security group.
type SecurityGroup struct {
	ID, Name, Description, VpcID string
	Tags                         map[string]string
	Ingress                      []Permission
}

// Server is the in-test EC2 API. The zero value is not ready; use Start.
type Server struct {
	*httptest.Server
	// Script holds the faults tests queue: Fail, FailAfter, HangAfter.
	cloudfault.Script[Error]
	// Region is the region the Authorization header's scope must name.
	Region string

	mu        sync.Mutex
	keys      map[string]string // access key ID → secret access key
	instances map[string]*Instance
	tokens    map[string]string // client token → instance ID
	// launched is what each token's launch asked for (image and type):
	// a repeat asking for something else is IdempotentParameterMismatch.
	launched map[string]string
	groups   map[string]*SecurityGroup
	images   []Image
	calls    []Call
	seq      int
	pageSize int
	vpc      string // the default VPC's ID
	// bootIP, when set, makes new instances start running at this public
	// address (LaunchRunning).
	bootIP string
}

// Call is one request the server answered (or held).
type Call struct {
	Action string
	// Form is the request's decoded form.
	Form url.Values
	// Authorization is the request's Authorization header.
	Authorization string
}

// The images Start knows: Debian's (owner 136693071363) older and newer
// Debian 12 for x86-64 and one for arm64, and a newer look-alike of the
// x86-64 name from another owner (999999999999).
const (
	DebianAMD64Old = "ami-0de12a00000000001"
	DebianAMD64    = "ami-0de12a00000000002"
	DebianARM64    = "ami-0de12b00000000003"
	LookalikeAMD64 = "ami-0bad0000000000004"
)

// DefaultAccessKeyID and DefaultSecretAccessKey are the access key Start
// accepts.
const (
	DefaultAccessKeyID     = "AKIDPROXYFLEETTEST01"
	DefaultSecretAccessKey = "proxyfleet/test/secret/access/key/0000001"
)

// Start starts the server on 127.0.0.1 for region, accepting
// DefaultAccessKeyID, and closes it at cleanup. It knows one Debian image
// per architecture and a default VPC.
func Start(t testing.TB, region string) *Server {
	t.Helper()
	s := &Server{Region: region, keys: map[string]string{DefaultAccessKeyID: DefaultSecretAccessKey},
		instances: map[string]*Instance{}, tokens: map[string]string{}, launched: map[string]string{}, groups: map[string]*SecurityGroup{},

		pageSize: 1000, vpc: "vpc-0default0000000001"}
	s.images = []Image{
		{ID: DebianAMD64Old, Name: "debian-12-amd64-20260101-2000", Owner: "136693071363", Architecture: "x86_64", Created: time.Date(2026, 1, 1, 20, 0, 0, 0, time.UTC)},
		{ID: DebianAMD64, Name: "debian-12-amd64-20261101-2100", Owner: "136693071363", Architecture: "x86_64", Created: time.Date(2026, 11, 1, 21, 0, 0, 0, time.UTC)},
		{ID: DebianARM64, Name: "debian-12-arm64-20261101-2100", Owner: "136693071363", Architecture: "arm64", Created: time.Date(2026, 11, 1, 21, 0, 0, 0, time.UTC)},
		{ID: LookalikeAMD64, Name: "debian-12-amd64-20261201-0000", Owner: "999999999999", Architecture: "x86_64", Created: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// AddAccessKey makes the server accept another access key.
func (s *Server) AddAccessKey(id, secret string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[id] = secret
}

// AddImage adds an image DescribeImages may answer.
func (s *Server) AddImage(img Image) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.images = append(s.images, img)
}

// LaunchRunning makes every instance launched from now on start running at
// the public address ip (and 10.0.0.x privately), as if EC2 had booted it
// at once: for tests about many instances rather than one's boot. "" stops
// it.
func (s *Server) LaunchRunning(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bootIP = ip
}

// SetPageSize bounds how many reservations one DescribeInstances page holds.
func (s *Server) SetPageSize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pageSize = n
}

// Put stores an instance as it is, for tests that need one the provider
// did not make (a stranger, another installation's). ID, State, Zone and
// LaunchTime are filled when empty.
func (s *Server) Put(in Instance) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.ID == "" {
		in.ID = s.newID("i-")
	}
	if in.State == "" {
		in.State = StateRunning
	}
	if in.Zone == "" {
		in.Zone = s.Region + "a"
	}
	if in.LaunchTime.IsZero() {
		in.LaunchTime = time.Now().UTC()
	}
	in.Tags = cloneMap(in.Tags)
	s.instances[in.ID] = &in
	return in.ID
}

// Instance returns a copy of the instance with id, and whether it exists.
func (s *Server) Instance(id string) (Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.instances[id]
	if !ok {
		return Instance{}, false
	}
	return in.clone(), true
}

// Instances returns copies of every stored instance, terminated ones
// included, by launch order.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Instance, 0, len(s.instances))
	for _, in := range s.instances {
		out = append(out, in.clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Live returns the instances not terminated (shutting-down ones included:
// they still bill until they are gone).
func (s *Server) Live() []Instance {
	var out []Instance
	for _, in := range s.Instances() {
		if in.State != StateTerminated {
			out = append(out, in)
		}
	}
	return out
}

// SetState moves an instance to state, as EC2 would.
func (s *Server) SetState(id, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in, ok := s.instances[id]; ok {
		in.State = state
	}
}

// SetAddresses gives an instance its private and public IPv4 and IPv6
// addresses ("" leaves one unset).
func (s *Server) SetAddresses(id, private, public, ipv6 string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in, ok := s.instances[id]; ok {
		in.PrivateIP, in.PublicIP, in.IPv6 = private, public, ipv6
	}
}

// SecurityGroups returns copies of every stored security group.
func (s *Server) SecurityGroups() []SecurityGroup {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SecurityGroup, 0, len(s.groups))
	for _, g := range s.groups {
		c := *g
		c.Tags = cloneMap(g.Tags)
		c.Ingress = clonePerms(g.Ingress)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// PutSecurityGroup stores a group as it is and returns its ID.
func (s *Server) PutSecurityGroup(g SecurityGroup) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.ID == "" {
		g.ID = s.newID("sg-")
	}
	if g.VpcID == "" {
		g.VpcID = s.vpc
	}
	g.Ingress = clonePerms(g.Ingress)
	g.Tags = cloneMap(g.Tags)
	s.groups[g.ID] = &g
	return g.ID
}

// Calls returns every call so far, in order.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// Actions returns the action of every call so far, in order.
func (s *Server) Actions() []string {
	var out []string
	for _, c := range s.Calls() {
		out = append(out, c.Action)
	}
	return out
}

// CallCount counts the calls of action.
func (s *Server) CallCount(action string) int {
	n := 0
	for _, c := range s.Calls() {
		if c.Action == action {
			n++
		}
	}
	return n
}

func (in *Instance) clone() Instance {
	c := *in
	c.Tags = cloneMap(in.Tags)
	c.VolumeTags = cloneMap(in.VolumeTags)
	c.NICTags = cloneMap(in.NICTags)
	c.SecurityGroups = slices.Clone(in.SecurityGroups)
	return c
}

func clonePerms(ps []Permission) []Permission {
	out := make([]Permission, len(ps))
	for i, p := range ps {
		out[i] = Permission{Protocol: p.Protocol, FromPort: p.FromPort, ToPort: p.ToPort,
			CIDRs: slices.Clone(p.CIDRs), IPv6CIDRs: slices.Clone(p.IPv6CIDRs), Groups: slices.Clone(p.Groups)}
	}
	return out
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (s *Server) newID(prefix string) string {
	s.seq++
	return fmt.Sprintf("%s%017x", prefix, 0xabc000+s.seq)
}
