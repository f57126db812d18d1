// Package doapi is an in-test DigitalOcean API: the droplet, firewall and
// tag calls the digitalocean provider makes (create, list by name or tag
// with pages, get and delete a droplet; list, create and update a
// firewall; create a tag), answering JSON as api.digitalocean.com does,
// with its error bodies ({"id": ..., "message": ...}), for the real godo
// client to talk to through its base URL. It checks every request's
// bearer token against the tokens it knows, fails and hangs on cue, and
// records every call. Like the cloud, it has no idempotency key: a create
// repeated makes a second droplet, which is what the provider's
// look-up-before-create must prevent.
//
// It imports the standard library and cloudfault (the fault script every
// in-test cloud shares) only: nothing else of ours and no
// DigitalOcean library, so a test links the cloud's client only through the
// code under test.
package doapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/cloudfault"
)

// Operations, for Fail, FailAfter, HangAfter and CallCount.
const (
	CreateDroplet  = "droplets.create"
	ListDroplets   = "droplets.list"
	GetDroplet     = "droplets.get"
	DeleteDroplet  = "droplets.delete"
	ListFirewalls  = "firewalls.list"
	CreateFirewall = "firewalls.create"
	UpdateFirewall = "firewalls.update"
	CreateTag      = "tags.create"
)

// Droplet statuses as DigitalOcean names them.
const (
	StatusNew     = "new"
	StatusActive  = "active"
	StatusOff     = "off"
	StatusArchive = "archive"
)

// DefaultToken is the API token Start accepts.
const DefaultToken = "dop_v1_proxyfleettest0000000000000000000000000000000000000000000001"

// The images, sizes and regions Start knows.
var (
	Images  = []string{"debian-12-x64", "debian-13-x64", "ubuntu-24-04-x64"}
	Sizes   = []string{"s-1vcpu-512mb-10gb", "s-1vcpu-1gb", "s-2vcpu-2gb"}
	Regions = []string{"ams3", "fra1", "lon1", "nyc3", "sfo3"}
)

// Error is one error answer: DigitalOcean's status, id and message.
type Error struct {
	Status  int
	ID      string
	Message string
}

// Quota is the answer to a droplet create over the account's limit.
var Quota = Error{Status: 422, ID: "unprocessable_entity", Message: "creating this/these droplet(s) will exceed your droplet limit"}

// Throttled is the answer over the API's rate limit.
var Throttled = Error{Status: 429, ID: "too_many_requests", Message: "API Rate limit exceeded."}

// Droplet is one stored droplet.
type Droplet struct {
	ID                    int
	Name, Region, Size    string
	Image                 string
	Status                string
	PublicIPv4, PrivateIP string
	IPv6                  string
	WantIPv6              bool
	Tags                  []string
	SSHKeys               []string
	VPCUUID               string
	UserData              string
	Created               time.Time
}

// Rule is one inbound firewall rule: a protocol, a port ("3128", "1-65535"
// or "" for all) and its source addresses.
type Rule struct {
	Protocol, Ports string
	Addresses       []string
}

// Firewall is one stored firewall.
type Firewall struct {
	ID, Name string
	Inbound  []Rule
	// Outbound are the outbound rules, same shape, Addresses being
	// destinations.
	Outbound []Rule
	Tags     []string
}

// Call is one request the server answered (or held).
type Call struct {
	Op            string
	Method, Path  string
	Query         string
	Body          string
	Authorization string
}

// Server is the in-test API. Use Start.
type Server struct {
	*httptest.Server
	// Script holds the faults tests queue: Fail, FailAfter, HangAfter.
	cloudfault.Script[Error]

	mu        sync.Mutex
	tokens    map[string]bool
	droplets  map[int]*Droplet
	firewalls map[string]*Firewall
	tags      map[string]bool
	calls     []Call
	seq       int
	pageSize  int
	bootIP    string
	limit     int
}

// Start starts the server on 127.0.0.1, accepting DefaultToken, and closes
// it at cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{tokens: map[string]bool{DefaultToken: true}, droplets: map[int]*Droplet{}, firewalls: map[string]*Firewall{},
		tags:     map[string]bool{},
		pageSize: 200, seq: 3164400}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// AddToken makes the server accept another token.
func (s *Server) AddToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[token] = true
}

// SetDropletLimit makes a create that would hold more than n droplets
// fail as DigitalOcean's droplet limit does (0: no limit).
func (s *Server) SetDropletLimit(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit = n
}

// LaunchRunning makes every droplet created from now on start active at
// the public address ip; "" stops it.
func (s *Server) LaunchRunning(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bootIP = ip
}

// SetPageSize bounds how many droplets or firewalls one page holds.
func (s *Server) SetPageSize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pageSize = n
}

// Put stores a droplet as it is (a stranger, another installation's) and
// returns its ID. Status, Region and Created are filled when empty.
func (s *Server) Put(d Droplet) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.ID == 0 {
		s.seq++
		d.ID = s.seq
	}
	if d.Status == "" {
		d.Status = StatusActive
	}
	if d.Region == "" {
		d.Region = "ams3"
	}
	if d.Created.IsZero() {
		d.Created = time.Now().UTC()
	}
	d.Tags = slices.Clone(d.Tags)
	s.droplets[d.ID] = &d
	return d.ID
}

// Droplets returns copies of every stored droplet, by ID.
func (s *Server) Droplets() []Droplet {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Droplet, 0, len(s.droplets))
	for _, d := range s.droplets {
		c := *d
		c.Tags, c.SSHKeys = slices.Clone(d.Tags), slices.Clone(d.SSHKeys)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Droplet returns a copy of the droplet with id, and whether it exists.
func (s *Server) Droplet(id int) (Droplet, bool) {
	for _, d := range s.Droplets() {
		if d.ID == id {
			return d, true
		}
	}
	return Droplet{}, false
}

// SetStatus moves a droplet to status.
func (s *Server) SetStatus(id int, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.droplets[id]; ok {
		d.Status = status
	}
}

// SetAddresses gives a droplet its public and private IPv4 and its IPv6
// address ("" leaves one unset).
func (s *Server) SetAddresses(id int, public, private, ipv6 string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.droplets[id]; ok {
		d.PublicIPv4, d.PrivateIP, d.IPv6 = public, private, ipv6
	}
}

// Firewalls returns copies of every stored firewall, by ID.
func (s *Server) Firewalls() []Firewall {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Firewall, 0, len(s.firewalls))
	for _, f := range s.firewalls {
		out = append(out, f.clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// PutFirewall stores a firewall as it is and returns its ID.
func (s *Server) PutFirewall(f Firewall) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.ID == "" {
		f.ID = s.newUUID()
	}
	c := f.clone()
	s.firewalls[f.ID] = &c
	for _, t := range f.Tags {
		s.tags[t] = true
	}
	return f.ID
}

// Tags returns the names of the tags the account has.
func (s *Server) Tags() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for t := range s.tags {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Calls returns every call so far, in order.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// Ops returns the operation of every call so far, in order.
func (s *Server) Ops() []string {
	var out []string
	for _, c := range s.Calls() {
		out = append(out, c.Op)
	}
	return out
}

// CallCount counts the calls of op.
func (s *Server) CallCount(op string) int {
	n := 0
	for _, c := range s.Calls() {
		if c.Op == op {
			n++
		}
	}
	return n
}

func (f Firewall) clone() Firewall {
	c := f
	c.Tags = slices.Clone(f.Tags)
	c.Inbound, c.Outbound = cloneRules(f.Inbound), cloneRules(f.Outbound)
	return c
}

func cloneRules(rs []Rule) []Rule {
	out := make([]Rule, len(rs))
	for i, r := range rs {
		out[i] = Rule{Protocol: r.Protocol, Ports: r.Ports, Addresses: slices.Clone(r.Addresses)}
	}
	return out
}

func (s *Server) newUUID() string {
	s.seq++
	return fmt.Sprintf("bb4b2611-3d72-467b-8602-%012d", s.seq)
}

// validTag is DigitalOcean's tag syntax.
func validTag(t string) bool {
	if t == "" || len(t) > 255 {
		return false
	}
	return strings.Trim(t, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:-_") == ""
}
