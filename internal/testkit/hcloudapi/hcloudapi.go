// Package hcloudapi is an in-test Hetzner Cloud API: the server and
// firewall calls the hetzner provider makes (create, list by name or label
// selector with pages, get and delete a server; list, create a firewall and
// set its rules), answering JSON as api.hetzner.cloud does, with its error
// bodies ({"error": {"code": ..., "message": ...}}), for the real hcloud-go
// client to talk to through its endpoint. It checks every request's bearer
// token, keeps server and firewall names unique per project as Hetzner does
// (uniqueness_error), fails and hangs on cue, and records every call. Like
// the cloud, it has no idempotency key.
//
// It imports the standard library and cloudfault (the fault script every
// in-test cloud shares) only: nothing else of ours and no Hetzner
// library, so a test links the cloud's client only through the code under
// test.
package hcloudapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testkit/cloudfault"
)

// Operations, for Fail, FailAfter, HangAfter and CallCount.
const (
	CreateServer     = "servers.create"
	ListServers      = "servers.list"
	GetServer        = "servers.get"
	DeleteServer     = "servers.delete"
	ListFirewalls    = "firewalls.list"
	CreateFirewall   = "firewalls.create"
	SetFirewallRules = "firewalls.set_rules"
)

// Server statuses as Hetzner names them.
const (
	StatusInitializing = "initializing"
	StatusStarting     = "starting"
	StatusRunning      = "running"
	StatusStopping     = "stopping"
	StatusOff          = "off"
	StatusDeleting     = "deleting"
)

// DefaultToken is the API token Start accepts.
const DefaultToken = "hcloudproxyfleettest0000000000000000000000000000000000000000001"

// The images, server types and locations Start knows.
var (
	Images      = []string{"debian-12", "debian-13", "ubuntu-24.04"}
	ServerTypes = []string{"cx22", "cpx11", "cax11"}
	Locations   = []string{"fsn1", "nbg1", "hel1", "ash", "hil", "sin"}
)

// Error is one error answer: the HTTP status, Hetzner's code and message.
type Error struct {
	Status  int
	Code    string
	Message string
}

// Quota is the answer to a server create over the project's limit.
var Quota = Error{Status: 403, Code: "resource_limit_exceeded", Message: "server limit exceeded"}

// Throttled is the answer over the API's rate limit.
var Throttled = Error{Status: 429, Code: "rate_limit_exceeded", Message: "limit of 3600 requests per hour reached"}

// Server is one stored server.
type Server struct {
	ID                   int64
	Name, Type, Image    string
	Location             string
	Status               string
	IPv4                 string
	IPv6Net              string // the /64, as Hetzner reports it
	EnableIPv4           bool
	EnableIPv6           bool
	Labels               map[string]string
	SSHKeys              []int64
	Firewalls            []int64
	UserData             string
	StartAfterCreateSent bool
	Created              time.Time
}

// Rule is one firewall rule.
type Rule struct {
	Direction, Protocol, Port string
	IPs                       []string
	Description               string
}

// Firewall is one stored firewall.
type Firewall struct {
	ID     int64
	Name   string
	Labels map[string]string
	Rules  []Rule
}

// Call is one request the server answered (or held).
type Call struct {
	Op            string
	Method, Path  string
	Query         string
	Body          string
	Authorization string
}

// API is the in-test Hetzner Cloud API. Use Start.
type API struct {
	*httptest.Server
	// Script holds the faults tests queue: Fail, FailAfter, HangAfter.
	cloudfault.Script[Error]

	mu        sync.Mutex
	tokens    map[string]bool
	servers   map[int64]*Server
	firewalls map[int64]*Firewall
	calls     []Call
	seq       int64
	pageSize  int
	bootIP    string
	limit     int
}

// Start starts the API on 127.0.0.1, accepting DefaultToken, and closes it
// at cleanup. Its URL is the base the client's endpoint takes (it serves
// under /v1).
func Start(t testing.TB) *API {
	t.Helper()
	a := &API{tokens: map[string]bool{DefaultToken: true}, servers: map[int64]*Server{}, firewalls: map[int64]*Firewall{},
		pageSize: 50, seq: 42000000}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.Close)
	return a
}

// Endpoint is the client's endpoint: the URL and /v1.
func (a *API) Endpoint() string { return a.URL + "/v1" }

// AddToken makes the API accept another token.
func (a *API) AddToken(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tokens[token] = true
}

// SetServerLimit makes a create that would hold more than n servers fail
// as the project's server limit does (0: no limit).
func (a *API) SetServerLimit(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.limit = n
}

// LaunchRunning makes every server created from now on start running at
// the public IPv4 address ip; "" stops it.
func (a *API) LaunchRunning(ip string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bootIP = ip
}

// SetPageSize bounds how many servers or firewalls one page holds.
func (a *API) SetPageSize(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pageSize = n
}

// Put stores a server as it is (a stranger, another installation's) and
// returns its ID. Status, Location and Created are filled when empty.
func (a *API) Put(s Server) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s.ID == 0 {
		a.seq++
		s.ID = a.seq
	}
	if s.Status == "" {
		s.Status = StatusRunning
	}
	if s.Location == "" {
		s.Location = "fsn1"
	}
	if s.Created.IsZero() {
		s.Created = time.Now().UTC()
	}
	s.Labels = cloneMap(s.Labels)
	a.servers[s.ID] = &s
	return s.ID
}

// Servers returns copies of every stored server, by ID.
func (a *API) Servers() []Server {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Server, 0, len(a.servers))
	for _, s := range a.servers {
		c := *s
		c.Labels, c.SSHKeys, c.Firewalls = cloneMap(s.Labels), slices.Clone(s.SSHKeys), slices.Clone(s.Firewalls)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// SetStatus moves a server to status.
func (a *API) SetStatus(id int64, status string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s, ok := a.servers[id]; ok {
		s.Status = status
	}
}

// SetAddresses gives a server its public IPv4 address and IPv6 network
// ("2001:db8:1:2::/64"); "" leaves one unset.
func (a *API) SetAddresses(id int64, ipv4, ipv6Net string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s, ok := a.servers[id]; ok {
		s.IPv4, s.IPv6Net = ipv4, ipv6Net
	}
}

// Firewalls returns copies of every stored firewall, by ID.
func (a *API) Firewalls() []Firewall {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Firewall, 0, len(a.firewalls))
	for _, f := range a.firewalls {
		out = append(out, f.clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// PutFirewall stores a firewall as it is and returns its ID.
func (a *API) PutFirewall(f Firewall) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if f.ID == 0 {
		a.seq++
		f.ID = a.seq
	}
	c := f.clone()
	a.firewalls[f.ID] = &c
	return f.ID
}

// Calls returns every call so far, in order.
func (a *API) Calls() []Call {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

// Ops returns the operation of every call so far, in order.
func (a *API) Ops() []string {
	var out []string
	for _, c := range a.Calls() {
		out = append(out, c.Op)
	}
	return out
}

// CallCount counts the calls of op.
func (a *API) CallCount(op string) int {
	n := 0
	for _, c := range a.Calls() {
		if c.Op == op {
			n++
		}
	}
	return n
}

func (f Firewall) clone() Firewall {
	c := f
	c.Labels = cloneMap(f.Labels)
	c.Rules = make([]Rule, len(f.Rules))
	for i, r := range f.Rules {
		c.Rules[i] = r
		c.Rules[i].IPs = slices.Clone(r.IPs)
	}
	return c
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

func (a *API) newActionID() int64 {
	a.seq++
	return a.seq
}

func errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}
