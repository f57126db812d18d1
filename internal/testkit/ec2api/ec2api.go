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
// It imports the standard library only: nothing of ours (never the aws
// provider it stands in for) and no AWS library, so a test links the
// cloud's client only through the code under test.
package ec2api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
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
	// UserData is the decoded user-data.
	UserData    string
	ClientToken string
	LaunchTime  time.Time
}

// Image is one image DescribeImages knows.
type Image struct {
	ID, Name, Owner, Architecture string
	Created                       time.Time
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
	failures map[string][]Error
	after    map[string][]Error // answered after the action took effect
	hangs    map[string]int     // actions whose answer never comes, after taking effect
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
		failures: map[string][]Error{}, after: map[string][]Error{}, hangs: map[string]int{},
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

// Fail queues errors the next calls of action answer with, one call each,
// before doing anything.
func (s *Server) Fail(action string, errs ...Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[action] = append(s.failures[action], errs...)
}

// FailAfter queues errors the next calls of action answer with after the
// action took effect (a RunInstances answered 500 although the instance was
// made), one call each.
func (s *Server) FailAfter(action string, errs ...Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.after[action] = append(s.after[action], errs...)
}

// HangAfter makes the next n calls of action take effect and then never
// answer, until the client gives up (its context ends) or the server
// closes: an answer lost on the way back.
func (s *Server) HangAfter(action string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hangs[action] += n
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

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, Error{Status: 400, Code: "InvalidAction", Message: "EC2 takes form-encoded POSTs"})
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, Error{Status: 400, Code: "MalformedQueryString", Message: err.Error()})
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		writeError(w, Error{Status: 400, Code: "MalformedQueryString", Message: err.Error()})
		return
	}
	action := form.Get("Action")
	s.mu.Lock()
	s.calls = append(s.calls, Call{Action: action, Form: form, Authorization: r.Header.Get("Authorization")})
	if e, ok := s.authenticate(r, body); !ok {
		s.mu.Unlock()
		writeError(w, e)
		return
	}
	if form.Get("Version") != "2016-11-15" {
		s.mu.Unlock()
		writeError(w, Error{Status: 400, Code: "InvalidParameterValue", Message: "unsupported API version " + form.Get("Version")})
		return
	}
	if q := s.failures[action]; len(q) > 0 {
		s.failures[action] = q[1:]
		s.mu.Unlock()
		writeError(w, q[0])
		return
	}
	answer, e := s.do(action, form)
	var after *Error
	if q := s.after[action]; e == nil && len(q) > 0 {
		s.after[action] = q[1:]
		after = &q[0]
	}
	hang := e == nil && after == nil && s.hangs[action] > 0
	if hang {
		s.hangs[action]--
	}
	s.mu.Unlock()
	switch {
	case e != nil:
		writeError(w, *e)
	case after != nil:
		writeError(w, *after)
	case hang:
		// The action took effect; its answer is lost. Hold the request
		// until the client gives up or the server closes.
		<-r.Context().Done()
	default:
		w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
		_, _ = w.Write([]byte(xml.Header))
		_ = xml.NewEncoder(w).Encode(answer)
	}
}

// authenticate checks the request's SigV4 signature as AWS does before
// anything else: an Authorization header whose credential scope names a
// known access key, this region and ec2, and whose signature is the one
// that key's secret gives the request.
func (s *Server) authenticate(r *http.Request, body []byte) (Error, bool) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return Error{Status: 401, Code: "MissingAuthenticationToken", Message: "Request is missing Authentication Token"}, false
	}
	const alg = "AWS4-HMAC-SHA256 Credential="
	if !strings.HasPrefix(auth, alg) || !strings.Contains(auth, "SignedHeaders=") || !strings.Contains(auth, "Signature=") {
		return Error{Status: 400, Code: "IncompleteSignature", Message: "Authorization header requires 'Credential', 'Signature' and 'SignedHeaders'"}, false
	}
	cred, _, _ := strings.Cut(strings.TrimPrefix(auth, alg), ",")
	parts := strings.Split(cred, "/")
	if len(parts) != 5 || s.keys[parts[0]] == "" {
		return Error{Status: 401, Code: "AuthFailure", Message: "AWS was not able to validate the provided access credentials"}, false
	}
	if parts[2] != s.Region || parts[3] != "ec2" || parts[4] != "aws4_request" {
		return Error{Status: 401, Code: "AuthFailure", Message: fmt.Sprintf("Credential should be scoped to a valid region (%s), service ec2", s.Region)}, false
	}
	date := r.Header.Get("X-Amz-Date")
	if date == "" || !strings.HasPrefix(date, parts[1]) {
		return Error{Status: 400, Code: "IncompleteSignature", Message: "X-Amz-Date header missing or not of the credential's day"}, false
	}
	if sigV4(r, body, auth, s.keys[parts[0]], strings.Join(parts[1:], "/"), date) {
		return Error{}, true
	}
	return Error{Status: 401, Code: "AuthFailure", Message: "AWS was not able to validate the provided access credentials"}, false
}

// sigV4 recomputes the request's AWS Signature Version 4 with secret and
// compares it with the one in auth.
func sigV4(r *http.Request, body []byte, auth, secret, scope, date string) bool {
	field := func(name string) string {
		i := strings.Index(auth, name+"=")
		if i < 0 {
			return ""
		}
		v, _, _ := strings.Cut(auth[i+len(name)+1:], ",")
		return strings.TrimSpace(v)
	}
	signed, signature := field("SignedHeaders"), field("Signature")
	var canon strings.Builder
	for _, h := range strings.Split(signed, ";") {
		var v string
		switch h {
		case "host":
			v = r.Host
		case "content-length":
			v = strconv.FormatInt(r.ContentLength, 10)
		default:
			v = strings.Join(r.Header.Values(h), ",")
		}
		canon.WriteString(h + ":" + strings.Join(strings.Fields(v), " ") + "\n")
	}
	payload := sha256.Sum256(body)
	path := r.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	request := strings.Join([]string{r.Method, path, r.URL.RawQuery, canon.String(), signed, hex.EncodeToString(payload[:])}, "\n")
	reqHash := sha256.Sum256([]byte(request))
	toSign := "AWS4-HMAC-SHA256\n" + date + "\n" + scope + "\n" + hex.EncodeToString(reqHash[:])
	key := []byte("AWS4" + secret)
	for _, part := range strings.Split(scope, "/") {
		key = hmacSHA256(key, part)
	}
	return hmac.Equal([]byte(hex.EncodeToString(hmacSHA256(key, toSign))), []byte(signature))
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// do carries out action under s.mu and returns its answer body.
func (s *Server) do(action string, f url.Values) (any, *Error) {
	switch action {
	case RunInstances:
		return s.runInstances(f)
	case DescribeInstances:
		return s.describeInstances(f)
	case TerminateInstances:
		return s.terminateInstances(f)
	case DescribeImages:
		return s.describeImages(f)
	case DescribeSecurityGroups:
		return s.describeSecurityGroups(f)
	case CreateSecurityGroup:
		return s.createSecurityGroup(f)
	case AuthorizeSecurityGroupIngress:
		return s.changeIngress(f, true)
	case RevokeSecurityGroupIngress:
		return s.changeIngress(f, false)
	}
	return nil, &Error{Status: 400, Code: "InvalidAction", Message: "The action " + action + " is not valid for this web service."}
}

func badParam(format string, args ...any) *Error {
	return &Error{Status: 400, Code: "InvalidParameterValue", Message: fmt.Sprintf(format, args...)}
}

func (s *Server) runInstances(f url.Values) (any, *Error) {
	token := f.Get("ClientToken")
	if id, ok := s.tokens[token]; ok && token != "" {
		in := s.instances[id]
		if s.launched[token] != f.Get("ImageId")+" "+f.Get("InstanceType") {
			return nil, &Error{Status: 400, Code: "IdempotentParameterMismatch", Message: "The client token you have provided is associated with a resource that is already deleted or with different parameters"}
		}
		if in == nil || in.State == StateTerminated {
			return nil, &Error{Status: 400, Code: "IdempotentInstanceTerminated", Message: "The client token you provided is associated with a resource that is already deleted. Please use a different client token."}
		}
		return s.reservation(in), nil
	}
	if f.Get("MinCount") != "1" || f.Get("MaxCount") != "1" {
		return nil, badParam("proxyfleet's stand-in launches exactly one instance (MinCount %q, MaxCount %q)", f.Get("MinCount"), f.Get("MaxCount"))
	}
	image := f.Get("ImageId")
	if !s.imageExists(image) {
		return nil, &Error{Status: 400, Code: "InvalidAMIID.NotFound", Message: fmt.Sprintf("The image id '[%s]' does not exist", image)}
	}
	typ := f.Get("InstanceType")
	if typ == "" || !strings.Contains(typ, ".") {
		return nil, badParam("Invalid value '%s' for InstanceType.", typ)
	}
	in := &Instance{ID: s.newID("i-"), Type: typ, ImageID: image, State: StatePending,
		Zone: f.Get("Placement.AvailabilityZone"), ClientToken: token, LaunchTime: time.Now().UTC(),
		VpcID: s.vpc, Tags: map[string]string{}}
	if in.Zone == "" {
		in.Zone = s.Region + "a"
	}
	if ud := f.Get("UserData"); ud != "" {
		b, err := base64.StdEncoding.DecodeString(ud)
		if err != nil {
			return nil, badParam("Invalid BASE64 encoding of user data.")
		}
		in.UserData = string(b)
	}
	in.SubnetID = f.Get("NetworkInterface.1.SubnetId")
	in.AssociatePublicIP = f.Get("NetworkInterface.1.AssociatePublicIpAddress")
	in.IPv6AddressCount, _ = strconv.Atoi(f.Get("NetworkInterface.1.Ipv6AddressCount"))
	in.SecurityGroups = indexed(f, "NetworkInterface.1.SecurityGroupId")
	if f.Get("SubnetId") != "" || len(indexed(f, "SecurityGroupId")) > 0 {
		if f.Get("NetworkInterface.1.DeviceIndex") != "" {
			return nil, &Error{Status: 400, Code: "InvalidParameterCombination", Message: "Network interfaces and an instance-level security groups may not be specified on the same request"}
		}
		in.SubnetID, in.SecurityGroups = f.Get("SubnetId"), indexed(f, "SecurityGroupId")
	}
	for _, g := range in.SecurityGroups {
		if _, ok := s.groups[g]; !ok {
			return nil, &Error{Status: 400, Code: "InvalidGroup.NotFound", Message: fmt.Sprintf("The security group '%s' does not exist", g)}
		}
	}
	for i := 1; ; i++ {
		p := fmt.Sprintf("TagSpecification.%d.", i)
		rt := f.Get(p + "ResourceType")
		if rt == "" {
			break
		}
		tags := tagsOf(f, p+"Tag")
		switch rt {
		case "instance":
			in.Tags = tags
		case "volume":
			in.VolumeTags = tags
		case "network-interface":
			in.NICTags = tags
		default:
			return nil, badParam("'%s' is not a valid taggable resource type for this operation.", rt)
		}
	}
	if s.bootIP != "" {
		in.State, in.PublicIP, in.PrivateIP = StateRunning, s.bootIP, fmt.Sprintf("10.0.0.%d", 1+s.seq%250)
	}
	s.instances[in.ID] = in
	if token != "" {
		s.tokens[token] = in.ID
		s.launched[token] = f.Get("ImageId") + " " + f.Get("InstanceType")
	}
	return s.reservation(in), nil
}

func (s *Server) imageExists(id string) bool {
	for _, img := range s.images {
		if img.ID == id {
			return true
		}
	}
	return false
}

func (s *Server) reservation(in *Instance) runInstancesResponse {
	return runInstancesResponse{Xmlns: xmlns, RequestID: s.requestID(), ReservationID: "r-" + strings.TrimPrefix(in.ID, "i-"),
		OwnerID: "123456789012", Instances: []instanceXML{instanceOf(in)}}
}

func (s *Server) requestID() string {
	s.seq++
	return fmt.Sprintf("7e1d4c1e-0000-4000-8000-%012d", s.seq)
}

func (s *Server) describeInstances(f url.Values) (any, *Error) {
	ids := indexed(f, "InstanceId")
	for _, id := range ids {
		if !strings.HasPrefix(id, "i-") {
			return nil, &Error{Status: 400, Code: "InvalidInstanceID.Malformed", Message: fmt.Sprintf("Invalid id: \"%s\"", id)}
		}
		if _, ok := s.instances[id]; !ok {
			return nil, &Error{Status: 400, Code: "InvalidInstanceID.NotFound", Message: fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
	}
	filters, e := filtersOf(f)
	if e != nil {
		return nil, e
	}
	var matched []*Instance
	for _, in := range s.instances {
		if len(ids) > 0 && !slices.Contains(ids, in.ID) {
			continue
		}
		if in.matches(filters) {
			matched = append(matched, in)
		}
	}
	sort.Slice(matched, func(i, j int) bool { return matched[i].ID < matched[j].ID })
	size := s.pageSize
	if m, err := strconv.Atoi(f.Get("MaxResults")); err == nil {
		if len(ids) > 0 {
			return nil, &Error{Status: 400, Code: "InvalidParameterCombination", Message: "The parameter instancesSet cannot be used with the parameter maxResults"}
		}
		if m < 5 || m > 1000 {
			return nil, badParam("Value ( %d ) for parameter maxResults is invalid. Expecting a value greater than 5.", m)
		}
		size = min(size, m)
	}
	start := 0
	if tok := f.Get("NextToken"); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "page-"))
		if err != nil || n < 0 || n > len(matched) {
			return nil, badParam("Invalid value for NextToken")
		}
		start = n
	}
	end := min(start+size, len(matched))
	resp := describeInstancesResponse{Xmlns: xmlns, RequestID: s.requestID()}
	for _, in := range matched[start:end] {
		resp.Reservations = append(resp.Reservations, reservationXML{ReservationID: "r-" + strings.TrimPrefix(in.ID, "i-"), OwnerID: "123456789012", Instances: []instanceXML{instanceOf(in)}})
	}
	if end < len(matched) {
		resp.NextToken = "page-" + strconv.Itoa(end)
	}
	// EC2 finishes a termination after it was seen shutting down. Only
	// a describe by ID moves it on, so a paginated list stays stable.
	for _, in := range matched[start:end] {
		if len(ids) == 0 {
			break
		}
		if in.State == StateShuttingDown {
			in.State = StateTerminated
		}
	}
	return resp, nil
}

// matches reports whether in passes every filter: tag:KEY, tag-key,
// instance-state-name, client-token and availability-zone.
func (in *Instance) matches(filters map[string][]string) bool {
	for name, values := range filters {
		var have []string
		switch {
		case strings.HasPrefix(name, "tag:"):
			if v, ok := in.Tags[strings.TrimPrefix(name, "tag:")]; ok {
				have = []string{v}
			}
		case name == "tag-key":
			for k := range in.Tags {
				have = append(have, k)
			}
		case name == "instance-state-name":
			have = []string{in.State}
		case name == "client-token":
			have = []string{in.ClientToken}
		case name == "availability-zone":
			have = []string{in.Zone}
		default:
			return false
		}
		if !slices.ContainsFunc(have, func(h string) bool { return matchAny(values, h) }) {
			return false
		}
	}
	return true
}

// matchAny reports whether v matches one of patterns, where * matches any run.
func matchAny(patterns []string, v string) bool {
	for _, p := range patterns {
		if wildcard(p, v) {
			return true
		}
	}
	return false
}

func wildcard(p, v string) bool {
	parts := strings.Split(p, "*")
	if len(parts) == 1 {
		return p == v
	}
	if !strings.HasPrefix(v, parts[0]) {
		return false
	}
	v = v[len(parts[0]):]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(v, mid)
		if i < 0 {
			return false
		}
		v = v[i+len(mid):]
	}
	return strings.HasSuffix(v, parts[len(parts)-1])
}

var knownFilters = []string{"instance-state-name", "client-token", "availability-zone", "tag-key", "name", "state", "architecture", "owner-id", "group-name", "vpc-id", "group-id"}

func filtersOf(f url.Values) (map[string][]string, *Error) {
	out := map[string][]string{}
	for i := 1; ; i++ {
		p := fmt.Sprintf("Filter.%d.", i)
		name := f.Get(p + "Name")
		if name == "" {
			return out, nil
		}
		if !strings.HasPrefix(name, "tag:") && !slices.Contains(knownFilters, name) {
			return nil, &Error{Status: 400, Code: "InvalidParameterValue", Message: fmt.Sprintf("The filter '%s' is invalid", name)}
		}
		out[name] = indexed(f, p+"Value")
	}
}

func (s *Server) terminateInstances(f url.Values) (any, *Error) {
	ids := indexed(f, "InstanceId")
	if len(ids) == 0 {
		return nil, &Error{Status: 400, Code: "MissingParameter", Message: "The request must contain the parameter InstanceId"}
	}
	resp := terminateInstancesResponse{Xmlns: xmlns, RequestID: s.requestID()}
	for _, id := range ids {
		in, ok := s.instances[id]
		if !ok {
			return nil, &Error{Status: 400, Code: "InvalidInstanceID.NotFound", Message: fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
		prev := in.State
		if in.State != StateTerminated {
			in.State = StateShuttingDown
		}
		resp.Changes = append(resp.Changes, stateChangeXML{InstanceID: id, Current: stateXML{Code: stateCodes[in.State], Name: in.State}, Previous: stateXML{Code: stateCodes[prev], Name: prev}})
	}
	return resp, nil
}

func (s *Server) describeImages(f url.Values) (any, *Error) {
	filters, e := filtersOf(f)
	if e != nil {
		return nil, e
	}
	owners := indexed(f, "Owner")
	ids := indexed(f, "ImageId")
	resp := describeImagesResponse{Xmlns: xmlns, RequestID: s.requestID()}
	for _, img := range s.images {
		if len(owners) > 0 && !slices.Contains(owners, img.Owner) || len(ids) > 0 && !slices.Contains(ids, img.ID) {
			continue
		}
		ok := true
		for name, values := range filters {
			switch name {
			case "name":
				ok = ok && matchAny(values, img.Name)
			case "state":
				ok = ok && matchAny(values, "available")
			case "architecture":
				ok = ok && matchAny(values, img.Architecture)
			case "owner-id":
				ok = ok && matchAny(values, img.Owner)
			default:
				return nil, &Error{Status: 400, Code: "InvalidParameterValue", Message: fmt.Sprintf("The filter '%s' is invalid", name)}
			}
		}
		if ok {
			resp.Images = append(resp.Images, imageXML{ID: img.ID, Name: img.Name, Owner: img.Owner, Architecture: img.Architecture,
				Created: img.Created.Format("2006-01-02T15:04:05.000Z"), State: "available"})
		}
	}
	return resp, nil
}

func (s *Server) describeSecurityGroups(f url.Values) (any, *Error) {
	filters, e := filtersOf(f)
	if e != nil {
		return nil, e
	}
	ids := indexed(f, "GroupId")
	resp := describeSecurityGroupsResponse{Xmlns: xmlns, RequestID: s.requestID()}
	var keys []string
	for id := range s.groups {
		keys = append(keys, id)
	}
	sort.Strings(keys)
	for _, id := range ids {
		if _, ok := s.groups[id]; !ok {
			return nil, &Error{Status: 400, Code: "InvalidGroup.NotFound", Message: fmt.Sprintf("The security group '%s' does not exist", id)}
		}
	}
	for _, id := range keys {
		g := s.groups[id]
		if len(ids) > 0 && !slices.Contains(ids, id) {
			continue
		}
		ok := true
		for name, values := range filters {
			switch {
			case name == "group-name":
				ok = ok && matchAny(values, g.Name)
			case name == "vpc-id":
				ok = ok && matchAny(values, g.VpcID)
			case name == "group-id":
				ok = ok && matchAny(values, g.ID)
			case strings.HasPrefix(name, "tag:"):
				v, has := g.Tags[strings.TrimPrefix(name, "tag:")]
				ok = ok && has && matchAny(values, v)
			default:
				return nil, &Error{Status: 400, Code: "InvalidParameterValue", Message: fmt.Sprintf("The filter '%s' is invalid", name)}
			}
		}
		if ok {
			resp.Groups = append(resp.Groups, groupOf(g))
		}
	}
	return resp, nil
}

func (s *Server) createSecurityGroup(f url.Values) (any, *Error) {
	name, desc := f.Get("GroupName"), f.Get("GroupDescription")
	if name == "" || desc == "" {
		return nil, &Error{Status: 400, Code: "MissingParameter", Message: "The request must contain the parameters GroupName and GroupDescription"}
	}
	vpc := f.Get("VpcId")
	if vpc == "" {
		vpc = s.vpc
	}
	for _, g := range s.groups {
		if g.Name == name && g.VpcID == vpc {
			return nil, &Error{Status: 400, Code: "InvalidGroup.Duplicate", Message: fmt.Sprintf("The security group '%s' already exists for VPC '%s'", name, vpc)}
		}
	}
	g := &SecurityGroup{ID: s.newID("sg-"), Name: name, Description: desc, VpcID: vpc}
	for i := 1; ; i++ {
		p := fmt.Sprintf("TagSpecification.%d.", i)
		rt := f.Get(p + "ResourceType")
		if rt == "" {
			break
		}
		if rt != "security-group" {
			return nil, badParam("'%s' is not a valid taggable resource type for this operation.", rt)
		}
		g.Tags = tagsOf(f, p+"Tag")
	}
	s.groups[g.ID] = g
	return createSecurityGroupResponse{Xmlns: xmlns, RequestID: s.requestID(), GroupID: g.ID}, nil
}

// changeIngress authorizes (add) or revokes ingress permissions, one
// (protocol, ports, range) at a time as EC2 stores them: a duplicate
// authorization or the revocation of a rule that does not exist fails the
// whole call, as EC2's does.
func (s *Server) changeIngress(f url.Values, add bool) (any, *Error) {
	g, ok := s.groups[f.Get("GroupId")]
	if !ok {
		return nil, &Error{Status: 400, Code: "InvalidGroup.NotFound", Message: fmt.Sprintf("The security group '%s' does not exist", f.Get("GroupId"))}
	}
	perms := clonePerms(g.Ingress)
	for i := 1; ; i++ {
		p := fmt.Sprintf("IpPermissions.%d.", i)
		proto := f.Get(p + "IpProtocol")
		if proto == "" {
			break
		}
		from, _ := strconv.Atoi(f.Get(p + "FromPort"))
		to, _ := strconv.Atoi(f.Get(p + "ToPort"))
		var ranges []string
		for j := 1; ; j++ {
			c := f.Get(fmt.Sprintf("%sIpRanges.%d.CidrIp", p, j))
			if c == "" {
				break
			}
			ranges = append(ranges, c)
		}
		for j := 1; ; j++ {
			c := f.Get(fmt.Sprintf("%sIpv6Ranges.%d.CidrIpv6", p, j))
			if c == "" {
				break
			}
			ranges = append(ranges, c)
		}
		for _, c := range ranges {
			idx := slices.IndexFunc(perms, func(q Permission) bool { return q.Protocol == proto && q.FromPort == from && q.ToPort == to })
			if add {
				if idx < 0 {
					perms = append(perms, Permission{Protocol: proto, FromPort: from, ToPort: to})
					idx = len(perms) - 1
				}
				q := &perms[idx]
				list := &q.CIDRs
				if strings.Contains(c, ":") {
					list = &q.IPv6CIDRs
				}
				if slices.Contains(*list, c) {
					return nil, &Error{Status: 400, Code: "InvalidPermission.Duplicate", Message: fmt.Sprintf("the specified rule \"peer: %s, TCP, from port: %d, to port: %d, ALLOW\" already exists", c, from, to)}
				}
				*list = append(*list, c)
				continue
			}
			found := false
			if idx >= 0 {
				q := &perms[idx]
				for _, list := range []*[]string{&q.CIDRs, &q.IPv6CIDRs} {
					if k := slices.Index(*list, c); k >= 0 {
						*list = slices.Delete(*list, k, k+1)
						found = true
					}
				}
				if len(q.CIDRs)+len(q.IPv6CIDRs)+len(q.Groups) == 0 {
					perms = slices.Delete(perms, idx, idx+1)
				}
			}
			if !found {
				return nil, &Error{Status: 400, Code: "InvalidPermission.NotFound", Message: "The specified rule does not exist in this security group."}
			}
		}
	}
	g.Ingress = perms
	return returnResponse{XMLName: xml.Name{Local: map[bool]string{true: "AuthorizeSecurityGroupIngressResponse", false: "RevokeSecurityGroupIngressResponse"}[add]},
		Xmlns: xmlns, RequestID: s.requestID(), Return: true}, nil
}

// indexed returns the values of prefix.1, prefix.2, ... up to the first gap.
func indexed(f url.Values, prefix string) []string {
	var out []string
	for i := 1; ; i++ {
		v, ok := f[prefix+"."+strconv.Itoa(i)]
		if !ok {
			return out
		}
		out = append(out, v[0])
	}
}

func tagsOf(f url.Values, prefix string) map[string]string {
	out := map[string]string{}
	for i := 1; ; i++ {
		p := prefix + "." + strconv.Itoa(i) + "."
		k, ok := f[p+"Key"]
		if !ok {
			return out
		}
		out[k[0]] = f.Get(p + "Value")
	}
}

const xmlns = "http://ec2.amazonaws.com/doc/2016-11-15/"

func writeError(w http.ResponseWriter, e Error) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(e.Status)
	_, _ = fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>ea966190-f9aa-478e-9ede-example</RequestID></Response>`,
		xmlEscape(e.Code), xmlEscape(e.Message))
}

func xmlEscape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// The XML shapes of EC2's answers, as the SDK's deserializers read them.

type stateXML struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type tagXML struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type groupRefXML struct {
	ID string `xml:"groupId"`
}

type ipv6XML struct {
	Address string `xml:"ipv6Address"`
}

type nicXML struct {
	ID        string    `xml:"networkInterfaceId"`
	SubnetID  string    `xml:"subnetId,omitempty"`
	VpcID     string    `xml:"vpcId,omitempty"`
	PrivateIP string    `xml:"privateIpAddress,omitempty"`
	IPv6      []ipv6XML `xml:"ipv6AddressesSet>item"`
}

type instanceXML struct {
	ID          string        `xml:"instanceId"`
	ImageID     string        `xml:"imageId"`
	State       stateXML      `xml:"instanceState"`
	Type        string        `xml:"instanceType"`
	LaunchTime  string        `xml:"launchTime"`
	Zone        string        `xml:"placement>availabilityZone"`
	SubnetID    string        `xml:"subnetId,omitempty"`
	VpcID       string        `xml:"vpcId,omitempty"`
	PrivateIP   string        `xml:"privateIpAddress,omitempty"`
	PublicIP    string        `xml:"ipAddress,omitempty"`
	IPv6        string        `xml:"ipv6Address,omitempty"`
	ClientToken string        `xml:"clientToken,omitempty"`
	Groups      []groupRefXML `xml:"groupSet>item"`
	Tags        []tagXML      `xml:"tagSet>item"`
	NICs        []nicXML      `xml:"networkInterfaceSet>item"`
}

func instanceOf(in *Instance) instanceXML {
	x := instanceXML{ID: in.ID, ImageID: in.ImageID, State: stateXML{Code: stateCodes[in.State], Name: in.State},
		Type: in.Type, LaunchTime: in.LaunchTime.Format("2006-01-02T15:04:05.000Z"), Zone: in.Zone,
		SubnetID: in.SubnetID, VpcID: in.VpcID, PrivateIP: in.PrivateIP, PublicIP: in.PublicIP, IPv6: in.IPv6, ClientToken: in.ClientToken}
	for _, g := range in.SecurityGroups {
		x.Groups = append(x.Groups, groupRefXML{ID: g})
	}
	keys := make([]string, 0, len(in.Tags))
	for k := range in.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		x.Tags = append(x.Tags, tagXML{Key: k, Value: in.Tags[k]})
	}
	if in.State != StateTerminated {
		nic := nicXML{ID: "eni-" + strings.TrimPrefix(in.ID, "i-"), SubnetID: in.SubnetID, VpcID: in.VpcID, PrivateIP: in.PrivateIP}
		if in.IPv6 != "" {
			nic.IPv6 = []ipv6XML{{Address: in.IPv6}}
		}
		x.NICs = []nicXML{nic}
	}
	return x
}

type reservationXML struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type runInstancesResponse struct {
	XMLName       xml.Name      `xml:"RunInstancesResponse"`
	Xmlns         string        `xml:"xmlns,attr"`
	RequestID     string        `xml:"requestId"`
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type describeInstancesResponse struct {
	XMLName      xml.Name         `xml:"DescribeInstancesResponse"`
	Xmlns        string           `xml:"xmlns,attr"`
	RequestID    string           `xml:"requestId"`
	Reservations []reservationXML `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type stateChangeXML struct {
	InstanceID string   `xml:"instanceId"`
	Current    stateXML `xml:"currentState"`
	Previous   stateXML `xml:"previousState"`
}

type terminateInstancesResponse struct {
	XMLName   xml.Name         `xml:"TerminateInstancesResponse"`
	Xmlns     string           `xml:"xmlns,attr"`
	RequestID string           `xml:"requestId"`
	Changes   []stateChangeXML `xml:"instancesSet>item"`
}

type imageXML struct {
	ID           string `xml:"imageId"`
	Name         string `xml:"name"`
	Owner        string `xml:"imageOwnerId"`
	State        string `xml:"imageState"`
	Architecture string `xml:"architecture"`
	Created      string `xml:"creationDate"`
}

type describeImagesResponse struct {
	XMLName   xml.Name   `xml:"DescribeImagesResponse"`
	Xmlns     string     `xml:"xmlns,attr"`
	RequestID string     `xml:"requestId"`
	Images    []imageXML `xml:"imagesSet>item"`
}

type cidrXML struct {
	CIDR string `xml:"cidrIp"`
}

type cidr6XML struct {
	CIDR string `xml:"cidrIpv6"`
}

type userGroupXML struct {
	ID string `xml:"groupId"`
}

type permissionXML struct {
	Protocol string         `xml:"ipProtocol"`
	FromPort int            `xml:"fromPort"`
	ToPort   int            `xml:"toPort"`
	Ranges   []cidrXML      `xml:"ipRanges>item"`
	Ranges6  []cidr6XML     `xml:"ipv6Ranges>item"`
	Groups   []userGroupXML `xml:"groups>item"`
}

type securityGroupXML struct {
	ID          string          `xml:"groupId"`
	Name        string          `xml:"groupName"`
	Description string          `xml:"groupDescription"`
	VpcID       string          `xml:"vpcId"`
	OwnerID     string          `xml:"ownerId"`
	Ingress     []permissionXML `xml:"ipPermissions>item"`
	Egress      []permissionXML `xml:"ipPermissionsEgress>item"`
	Tags        []tagXML        `xml:"tagSet>item"`
}

func groupOf(g *SecurityGroup) securityGroupXML {
	x := securityGroupXML{ID: g.ID, Name: g.Name, Description: g.Description, VpcID: g.VpcID, OwnerID: "123456789012",
		Egress: []permissionXML{{Protocol: "-1", Ranges: []cidrXML{{CIDR: "0.0.0.0/0"}}}}}
	for _, p := range g.Ingress {
		px := permissionXML{Protocol: p.Protocol, FromPort: p.FromPort, ToPort: p.ToPort}
		for _, c := range p.CIDRs {
			px.Ranges = append(px.Ranges, cidrXML{CIDR: c})
		}
		for _, c := range p.IPv6CIDRs {
			px.Ranges6 = append(px.Ranges6, cidr6XML{CIDR: c})
		}
		for _, id := range p.Groups {
			px.Groups = append(px.Groups, userGroupXML{ID: id})
		}
		x.Ingress = append(x.Ingress, px)
	}
	keys := make([]string, 0, len(g.Tags))
	for k := range g.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		x.Tags = append(x.Tags, tagXML{Key: k, Value: g.Tags[k]})
	}
	return x
}

type describeSecurityGroupsResponse struct {
	XMLName   xml.Name           `xml:"DescribeSecurityGroupsResponse"`
	Xmlns     string             `xml:"xmlns,attr"`
	RequestID string             `xml:"requestId"`
	Groups    []securityGroupXML `xml:"securityGroupInfo>item"`
}

type createSecurityGroupResponse struct {
	XMLName   xml.Name `xml:"CreateSecurityGroupResponse"`
	Xmlns     string   `xml:"xmlns,attr"`
	RequestID string   `xml:"requestId"`
	GroupID   string   `xml:"groupId"`
}

type returnResponse struct {
	XMLName   xml.Name
	Xmlns     string `xml:"xmlns,attr"`
	RequestID string `xml:"requestId"`
	Return    bool   `xml:"return"`
}
