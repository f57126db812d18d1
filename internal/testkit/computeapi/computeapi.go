// Package computeapi is an in-test Compute Engine API: the four instance
// endpoints the gcp provider calls, with the real JSON shapes and error
// bodies, failures on cue and a record of every call, for the real REST
// client to talk to through option.WithEndpoint.
//
// It imports the standard library and cloudfault (the fault script every
// in-test cloud shares) only: nothing else of ours (never the gcp
// provider it stands in for) and no Google client library, so a test links
// the cloud's client only through the code under test.
package computeapi

import (
	"encoding/json"
	"fmt"
	"github.com/proxyfleet/proxyfleet/internal/testkit/cloudfault"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is an in-test Compute Engine API serving the four instance
// endpoints the gcp provider uses (insert, get, delete, aggregated list) with
// the real JSON shapes: instance resources, zonal operations, aggregated
// lists with pages and scope warnings, and googleapi error bodies with
// reasons. The real REST client talks to it through option.WithEndpoint.
// Inserted instances start PROVISIONING; tests move them on with SetStatus and
// SetAddresses, as Compute Engine would.
type Server struct {
	*httptest.Server
	// Project is the only project the server knows; others are 404.
	Project string

	mu sync.Mutex
	// faults holds what Fail queued: this server answers failures
	// before a call does anything only (no FailAfter or HangAfter).
	faults    cloudfault.Script[Error]
	instances map[string]map[string]any // "zone/name" → instance JSON
	failPages map[string]Error          // list page token → failure
	opFails   []OperationFailure        // insert operations to end in error
	calls     []string                  // "METHOD path?query", in order
	pageSize  int
	// warnings are extra scopes in every aggregated list: "zones/x" → code.
	warnings map[string]string
	ops      int
}

// Error is one googleapi error the server answers with.
type Error struct {
	Code    int
	Reason  string
	Message string
}

// Compute operations, for Fail.
const (
	OpInsert = "insert"
	OpGet    = "get"
	OpDelete = "delete"
	OpList   = "list"
)

// Start starts the server on 127.0.0.1 and closes it at cleanup.
func Start(t testing.TB, project string) *Server {
	t.Helper()
	s := &Server{Project: project, instances: map[string]map[string]any{},
		failPages: map[string]Error{}, warnings: map[string]string{}, pageSize: 500}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// OperationFailure is an insert Compute Engine accepts (200) and answers
// with an operation that has already ended in error, as it answers a request
// it could not carry out (a zone out of capacity, a quota, a missing image).
type OperationFailure struct {
	// HTTPStatus is the operation's httpErrorStatusCode (503, 403, 400).
	HTTPStatus int
	// Code and Message are the operation's error item.
	Code, Message string
	// Leave keeps the instance the failed insert began, TERMINATED, as a
	// failure after its disk exists may; otherwise nothing is stored.
	Leave bool
}

// FailInsertOperations queues failures the next inserts answer with, one
// insert each.
func (s *Server) FailInsertOperations(fs ...OperationFailure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opFails = append(s.opFails, fs...)
}

// FailPage makes the aggregated-list page with pageToken token fail with e,
// so a test can break a list after its first page.
func (s *Server) FailPage(token string, e Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failPages[token] = e
}

// SetPageSize bounds how many scopes one aggregated-list page holds (the
// real API pages by instances; by scope is enough to exercise tokens).
func (s *Server) SetPageSize(n int) {
	s.mu.Lock()
	s.pageSize = n
	s.mu.Unlock()
}

// AddScopeWarning adds a scope with a warning and no instances to every list.
func (s *Server) AddScopeWarning(scope, code string) {
	s.mu.Lock()
	s.warnings[scope] = code
	s.mu.Unlock()
}

// Put stores an instance resource as it is, for tests that need a VM the
// provider did not create (a stranger, another owner, a given status).
func (s *Server) Put(zone string, inst map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst["zone"] = s.zoneURL(zone)
	if _, ok := inst["creationTimestamp"]; !ok {
		inst["creationTimestamp"] = time.Now().UTC().Format(time.RFC3339)
	}
	s.instances[zone+"/"+inst["name"].(string)] = inst
}

// Instance returns a copy of a stored instance resource, or nil.
func (s *Server) Instance(zone, name string) map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[zone+"/"+name]
	if !ok {
		return nil
	}
	b, _ := json.Marshal(inst)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// Instances returns the keys ("zone/name") of every stored instance, sorted.
func (s *Server) Instances() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.instances))
	for k := range s.instances {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// SetStatus sets an instance's status (RUNNING, STOPPED, ...).
func (s *Server) SetStatus(zone, name, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if inst, ok := s.instances[zone+"/"+name]; ok {
		inst["status"] = status
	}
}

// SetAddresses gives an instance's first interface its VPC address and, when
// natIP is not empty, the NAT IP of its access config.
func (s *Server) SetAddresses(zone, name, networkIP, natIP string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[zone+"/"+name]
	if !ok {
		return
	}
	nics, _ := inst["networkInterfaces"].([]any)
	if len(nics) == 0 {
		nics = []any{map[string]any{}}
	}
	nic := nics[0].(map[string]any)
	nic["networkIP"] = networkIP
	if natIP != "" {
		acs, _ := nic["accessConfigs"].([]any)
		if len(acs) == 0 {
			acs = []any{map[string]any{"type": "ONE_TO_ONE_NAT", "name": "external-nat"}}
		}
		acs[0].(map[string]any)["natIP"] = natIP
		nic["accessConfigs"] = acs
	}
	inst["networkInterfaces"] = nics
}

// Calls returns every request so far as "METHOD /path?query", in order.
func (s *Server) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// CallCount counts the requests whose "METHOD /path" starts with prefix.
func (s *Server) CallCount(prefix string) int {
	n := 0
	for _, c := range s.Calls() {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

func (s *Server) zoneURL(zone string) string {
	return s.URL + "/compute/v1/projects/" + s.Project + "/zones/" + zone
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	call := r.Method + " " + r.URL.Path
	if r.URL.RawQuery != "" {
		call += "?" + r.URL.RawQuery
	}
	s.calls = append(s.calls, call)

	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/compute/v1/projects/"), "/")
	if !strings.HasPrefix(r.URL.Path, "/compute/v1/projects/") || len(parts) < 2 {
		writeComputeError(w, Error{Code: 404, Reason: "notFound", Message: "The requested URL " + r.URL.Path + " was not found"})
		return
	}
	if parts[0] != s.Project {
		writeComputeError(w, Error{Code: 404, Reason: "notFound", Message: fmt.Sprintf("The resource 'projects/%s' was not found", parts[0])})
		return
	}
	switch {
	case len(parts) == 3 && parts[1] == "aggregated" && parts[2] == "instances" && r.Method == http.MethodGet:
		if s.fail(w, OpList) {
			return
		}
		s.list(w, r)
	case len(parts) == 4 && parts[1] == "zones" && parts[3] == "instances" && r.Method == http.MethodPost:
		if s.fail(w, OpInsert) {
			return
		}
		s.insert(w, r, parts[2])
	case len(parts) == 5 && parts[1] == "zones" && parts[3] == "instances" && r.Method == http.MethodGet:
		if s.fail(w, OpGet) {
			return
		}
		inst, ok := s.instances[parts[2]+"/"+parts[4]]
		if !ok {
			s.notFound(w, parts[2], parts[4])
			return
		}
		writeJSON(w, http.StatusOK, inst)
	case len(parts) == 5 && parts[1] == "zones" && parts[3] == "instances" && r.Method == http.MethodDelete:
		if s.fail(w, OpDelete) {
			return
		}
		key := parts[2] + "/" + parts[4]
		if _, ok := s.instances[key]; !ok {
			s.notFound(w, parts[2], parts[4])
			return
		}
		// Compute Engine deletes asynchronously; the test sees the instance
		// gone on the next Get, which is what polling to NotFound needs.
		delete(s.instances, key)
		writeJSON(w, http.StatusOK, s.operation("delete", parts[2], parts[4]))
	default:
		writeComputeError(w, Error{Code: 400, Reason: "badRequest", Message: "unsupported request " + call})
	}
}

func (s *Server) fail(w http.ResponseWriter, op string) bool {
	e, ok := s.faults.Before(op)
	if ok {
		writeComputeError(w, e)
	}
	return ok
}

// Fail queues errors the next calls of op answer with, one call each.
func (s *Server) Fail(op string, errs ...Error) { s.faults.Fail(op, errs...) }

func (s *Server) notFound(w http.ResponseWriter, zone, name string) {
	writeComputeError(w, Error{Code: 404, Reason: "notFound",
		Message: fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", s.Project, zone, name)})
}

func (s *Server) insert(w http.ResponseWriter, r *http.Request, zone string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var inst map[string]any
	if err != nil || json.Unmarshal(body, &inst) != nil {
		writeComputeError(w, Error{Code: 400, Reason: "parseError", Message: "Parse Error"})
		return
	}
	name, _ := inst["name"].(string)
	if name == "" {
		writeComputeError(w, Error{Code: 400, Reason: "required", Message: "Required field 'resource.name' not specified"})
		return
	}
	key := zone + "/" + name
	if _, ok := s.instances[key]; ok {
		writeComputeError(w, Error{Code: 409, Reason: "alreadyExists",
			Message: fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", s.Project, zone, name)})
		return
	}
	s.ops++
	inst["id"] = strconv.Itoa(1000 + s.ops)
	inst["kind"] = "compute#instance"
	inst["status"] = "PROVISIONING"
	inst["zone"] = s.zoneURL(zone)
	inst["selfLink"] = s.zoneURL(zone) + "/instances/" + name
	inst["creationTimestamp"] = time.Now().UTC().Format("2006-01-02T15:04:05.000-07:00")
	s.instances[key] = inst
	op := s.operation("insert", zone, name)
	if len(s.opFails) > 0 {
		f := s.opFails[0]
		s.opFails = s.opFails[1:]
		if f.Leave {
			inst["status"] = "TERMINATED"
		} else {
			delete(s.instances, key)
		}
		op["status"], op["progress"] = "DONE", 100
		op["httpErrorStatusCode"], op["httpErrorMessage"] = f.HTTPStatus, http.StatusText(f.HTTPStatus)
		op["error"] = map[string]any{"errors": []any{map[string]any{"code": f.Code, "message": f.Message}}}
	}
	writeJSON(w, http.StatusOK, op)
}

// operation is a zonal Operation resource as insert and delete return it.
func (s *Server) operation(kind, zone, name string) map[string]any {
	s.ops++
	id := strconv.Itoa(9000 + s.ops)
	return map[string]any{
		"kind": "compute#operation", "id": id, "name": "operation-" + id,
		"operationType": kind, "status": "PENDING", "progress": 0,
		"zone":       s.zoneURL(zone),
		"targetLink": s.zoneURL(zone) + "/instances/" + name,
		"selfLink":   s.zoneURL(zone) + "/operations/operation-" + id,
		"insertTime": time.Now().UTC().Format(time.RFC3339),
	}
}

// list serves an aggregated list: the filter must be a "labels.KEY = VALUE"
// expression (anything else is a 400, as the real API rejects bad filters),
// every zone becomes a scope, and scopes are cut into pages.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var fk, fv string
	if f := q.Get("filter"); f != "" {
		k, v, ok := strings.Cut(f, " = ")
		if !ok || !strings.HasPrefix(k, "labels.") {
			writeComputeError(w, Error{Code: 400, Reason: "invalid", Message: "Invalid value for field 'filter': '" + f + "'."})
			return
		}
		fk, fv = strings.TrimPrefix(k, "labels."), v
	}
	scopes := map[string]map[string]any{}
	for key, inst := range s.instances {
		if fk != "" {
			labels, _ := inst["labels"].(map[string]any)
			if labels[fk] != fv {
				continue
			}
		}
		zone, _, _ := strings.Cut(key, "/")
		sc := scopes["zones/"+zone]
		if sc == nil {
			sc = map[string]any{"instances": []any{}}
			scopes["zones/"+zone] = sc
		}
		sc["instances"] = append(sc["instances"].([]any), inst)
	}
	for scope, code := range s.warnings {
		scopes[scope] = map[string]any{"warning": map[string]any{
			"code": code, "message": "There are no results for scope '" + scope + "' on this page.",
			"data": []any{map[string]any{"key": "scope", "value": scope}},
		}}
	}
	keys := make([]string, 0, len(scopes))
	for k := range scopes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	size := s.pageSize
	if m, err := strconv.Atoi(q.Get("maxResults")); err == nil && m > 0 && m < size {
		size = m
	}
	start := 0
	if tok := q.Get("pageToken"); tok != "" {
		if e, ok := s.failPages[tok]; ok {
			writeComputeError(w, e)
			return
		}
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "page-"))
		if err != nil || n < 0 || n > len(keys) {
			writeComputeError(w, Error{Code: 400, Reason: "invalid", Message: "Invalid value for field 'pageToken'"})
			return
		}
		start = n
	}
	end := min(start+size, len(keys))
	items := map[string]any{}
	for _, k := range keys[start:end] {
		items[k] = scopes[k]
	}
	resp := map[string]any{
		"kind": "compute#instanceAggregatedList", "id": "projects/" + s.Project + "/aggregated/instances",
		"items": items, "selfLink": s.URL + r.URL.Path,
	}
	if end < len(keys) {
		resp["nextPageToken"] = "page-" + strconv.Itoa(end)
	}
	writeJSON(w, http.StatusOK, resp)
}

// writeComputeError writes a googleapi error body as Compute Engine does.
func writeComputeError(w http.ResponseWriter, e Error) {
	writeJSON(w, e.Code, map[string]any{"error": map[string]any{
		"code": e.Code, "message": e.Message,
		"errors": []any{map[string]any{"message": e.Message, "domain": "global", "reason": e.Reason}},
	}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
