package hcloudapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// serve routes one request, checks its token, fails or holds it as the test
// asked, else carries it out and answers Hetzner's JSON.
func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, Error{Status: 400, Code: "json_error", Message: err.Error()})
		return
	}
	op, id := route(r.Method, r.URL.Path)
	a.mu.Lock()
	a.calls = append(a.calls, Call{Op: op, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: string(body), Authorization: r.Header.Get("Authorization")})
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || !a.tokens[token] {
		a.mu.Unlock()
		writeError(w, Error{Status: 401, Code: "unauthorized", Message: "unable to authenticate"})
		return
	}
	if op == "" {
		a.mu.Unlock()
		writeError(w, Error{Status: 404, Code: "not_found", Message: "not found"})
		return
	}
	if e, ok := a.Before(op); ok {
		a.mu.Unlock()
		writeError(w, e)
		return
	}
	status, answer, e := a.do(op, id, r.URL.Query(), body)
	var (
		after *Error
		hang  bool
	)
	if e == nil {
		after, hang = a.After(op)
	}
	a.mu.Unlock()
	switch {
	case e != nil:
		writeError(w, *e)
	case after != nil:
		writeError(w, *after)
	case hang:
		<-r.Context().Done()
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(answer)
	}
}

func route(method, path string) (op string, id int64) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) < 2 || parts[0] != "v1" {
		return "", 0
	}
	if len(parts) >= 3 {
		n, err := strconv.ParseInt(parts[2], 10, 64)
		if err != nil {
			return "", 0
		}
		id = n
	}
	switch {
	case parts[1] == "servers" && len(parts) == 2 && method == http.MethodGet:
		return ListServers, 0
	case parts[1] == "servers" && len(parts) == 2 && method == http.MethodPost:
		return CreateServer, 0
	case parts[1] == "servers" && len(parts) == 3 && method == http.MethodGet:
		return GetServer, id
	case parts[1] == "servers" && len(parts) == 3 && method == http.MethodDelete:
		return DeleteServer, id
	case parts[1] == "firewalls" && len(parts) == 2 && method == http.MethodGet:
		return ListFirewalls, 0
	case parts[1] == "firewalls" && len(parts) == 2 && method == http.MethodPost:
		return CreateFirewall, 0
	case parts[1] == "firewalls" && len(parts) == 5 && parts[3] == "actions" && parts[4] == "set_rules" && method == http.MethodPost:
		return SetFirewallRules, id
	}
	return "", 0
}

func (a *API) do(op string, id int64, q url.Values, body []byte) (int, any, *Error) {
	switch op {
	case CreateServer:
		return a.createServer(body)
	case ListServers:
		return a.listServers(q)
	case GetServer:
		s, ok := a.servers[id]
		if !ok {
			return 0, nil, errorf(404, "not_found", "server with ID '%d' not found", id)
		}
		return 200, map[string]any{"server": serverJSON(s)}, nil
	case DeleteServer:
		s, ok := a.servers[id]
		if !ok {
			return 0, nil, errorf(404, "not_found", "server with ID '%d' not found", id)
		}
		delete(a.servers, id)
		return 200, map[string]any{"action": a.action("delete_server", "server", s.ID)}, nil
	case ListFirewalls:
		return a.listFirewalls(q)
	case CreateFirewall:
		return a.createFirewall(body)
	case SetFirewallRules:
		f, ok := a.firewalls[id]
		if !ok {
			return 0, nil, errorf(404, "not_found", "firewall with ID '%d' not found", id)
		}
		var in struct {
			Rules []ruleJSON `json:"rules"`
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return 0, nil, errorf(400, "json_error", "%v", err)
		}
		rules, e := rulesOf(in.Rules)
		if e != nil {
			return 0, nil, e
		}
		f.Rules = rules
		return 201, map[string]any{"actions": []any{a.action("set_firewall_rules", "firewall", f.ID)}}, nil
	}
	return 0, nil, errorf(404, "not_found", "not found")
}

func (a *API) action(command, resource string, id int64) map[string]any {
	return map[string]any{"id": a.newActionID(), "command": command, "status": "running", "progress": 0,
		"started": time.Now().UTC().Format(time.RFC3339), "finished": nil, "error": nil,
		"resources": []any{map[string]any{"id": id, "type": resource}}}
}

// labelPattern is Hetzner's label key and value syntax (a key may have a
// DNS prefix and a slash).
var (
	labelKey   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
	nameSyntax = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?$`)
)

func checkLabels(labels map[string]string) *Error {
	for k, v := range labels {
		if !labelKey.MatchString(k) || !labelValue.MatchString(v) {
			return errorf(400, "invalid_input", "invalid input in field 'labels': label %q=%q is invalid", k, v)
		}
	}
	return nil
}

type createRequest struct {
	Name             string            `json:"name"`
	ServerType       json.RawMessage   `json:"server_type"`
	Image            json.RawMessage   `json:"image"`
	Location         string            `json:"location"`
	SSHKeys          []int64           `json:"ssh_keys"`
	UserData         string            `json:"user_data"`
	StartAfterCreate *bool             `json:"start_after_create"`
	Labels           map[string]string `json:"labels"`
	Firewalls        []struct {
		Firewall int64 `json:"firewall"`
	} `json:"firewalls"`
	PublicNet *struct {
		EnableIPv4 bool `json:"enable_ipv4"`
		EnableIPv6 bool `json:"enable_ipv6"`
	} `json:"public_net"`
}

func (a *API) createServer(body []byte) (int, any, *Error) {
	var in createRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return 0, nil, errorf(400, "json_error", "%v", err)
	}
	var typ, image string
	_ = json.Unmarshal(in.ServerType, &typ)
	_ = json.Unmarshal(in.Image, &image)
	switch {
	case !nameSyntax.MatchString(in.Name):
		return 0, nil, errorf(400, "invalid_input", "invalid input in field 'name'")
	case !slices.Contains(ServerTypes, typ):
		return 0, nil, errorf(400, "invalid_input", "server type %q not found", typ)
	case !slices.Contains(Images, image):
		return 0, nil, errorf(400, "invalid_input", "image %q not found", image)
	case in.Location != "" && !slices.Contains(Locations, in.Location):
		return 0, nil, errorf(400, "invalid_input", "location %q not found", in.Location)
	case len(in.UserData) > 32<<10:
		return 0, nil, errorf(400, "invalid_input", "invalid input in field 'user_data': too long (32 KiB at most)")
	}
	if e := checkLabels(in.Labels); e != nil {
		return 0, nil, e
	}
	for _, s := range a.servers {
		if s.Name == in.Name {
			return 0, nil, errorf(409, "uniqueness_error", "server name is already used")
		}
	}
	if a.limit > 0 && len(a.servers) >= a.limit {
		return 0, nil, &Quota
	}
	s := &Server{Name: in.Name, Type: typ, Image: image, Location: in.Location, Status: StatusInitializing, SSHKeys: slices.Clone(in.SSHKeys),
		UserData: in.UserData, Labels: cloneMap(in.Labels), Created: time.Now().UTC(), EnableIPv4: true, EnableIPv6: true,
		StartAfterCreateSent: in.StartAfterCreate != nil}
	if s.Location == "" {
		s.Location = "fsn1"
	}
	if in.PublicNet != nil {
		s.EnableIPv4, s.EnableIPv6 = in.PublicNet.EnableIPv4, in.PublicNet.EnableIPv6
	}
	for _, f := range in.Firewalls {
		if _, ok := a.firewalls[f.Firewall]; !ok {
			return 0, nil, errorf(404, "not_found", "firewall with ID '%d' not found", f.Firewall)
		}
		s.Firewalls = append(s.Firewalls, f.Firewall)
	}
	a.seq++
	s.ID = a.seq
	if a.bootIP != "" {
		s.Status, s.IPv4 = StatusRunning, a.bootIP
	}
	a.servers[s.ID] = s
	return 201, map[string]any{"server": serverJSON(s), "action": a.action("create_server", "server", s.ID), "next_actions": []any{}, "root_password": nil}, nil
}

func serverJSON(s *Server) map[string]any {
	var v4 any
	if s.IPv4 != "" {
		v4 = map[string]any{"id": s.ID + 1, "ip": s.IPv4, "blocked": false, "dns_ptr": "static." + s.IPv4 + ".clients.your-server.de"}
	}
	var v6 any
	if s.IPv6Net != "" {
		v6 = map[string]any{"id": s.ID + 2, "ip": s.IPv6Net, "blocked": false, "dns_ptr": []any{}}
	}
	fws := []any{}
	for _, f := range s.Firewalls {
		fws = append(fws, map[string]any{"id": f, "status": "applied"})
	}
	labels := s.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return map[string]any{
		"id": s.ID, "name": s.Name, "status": s.Status, "created": s.Created.Format(time.RFC3339),
		"public_net":  map[string]any{"ipv4": v4, "ipv6": v6, "floating_ips": []any{}, "firewalls": fws},
		"private_net": []any{},
		"server_type": map[string]any{"id": 104, "name": s.Type, "cores": 2, "memory": 4, "disk": 40},
		"location":    map[string]any{"id": 1, "name": s.Location, "network_zone": "eu-central"},
		"image":       map[string]any{"id": 114690387, "type": "system", "status": "available", "name": s.Image, "os_flavor": "debian"},
		"labels":      labels, "protection": map[string]any{"delete": false, "rebuild": false},
		"volumes": []any{}, "load_balancers": []any{}, "locked": false, "rescue_enabled": false,
		"included_traffic": 21990232555520, "primary_disk_size": 40,
	}
}

// selects reports whether labels pass a label selector of
// comma-separated key=value, key!=value and key terms.
func selects(selector string, labels map[string]string) bool {
	if selector == "" {
		return true
	}
	for _, term := range strings.Split(selector, ",") {
		term = strings.TrimSpace(term)
		switch {
		case strings.Contains(term, "!="):
			k, v, _ := strings.Cut(term, "!=")
			if labels[k] == v {
				return false
			}
		case strings.Contains(term, "="):
			k, v, _ := strings.Cut(term, "=")
			if have, ok := labels[k]; !ok || have != v {
				return false
			}
		default:
			if _, ok := labels[term]; !ok {
				return false
			}
		}
	}
	return true
}

// page cuts n items into the page q asks for and returns its bounds and
// Hetzner's pagination meta.
func (a *API) page(q url.Values, n int) (start, end int, meta map[string]any, e *Error) {
	per := a.pageSize
	if v := q.Get("per_page"); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 50 {
			return 0, 0, nil, errorf(400, "invalid_input", "invalid input in field 'per_page'")
		}
		per = min(per, p)
	}
	pg := 1
	if v := q.Get("page"); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 {
			return 0, 0, nil, errorf(400, "invalid_input", "invalid input in field 'page'")
		}
		pg = p
	}
	start, end = min((pg-1)*per, n), min(pg*per, n)
	last := max(1, (n+per-1)/per)
	next := any(nil)
	if end < n {
		next = pg + 1
	}
	prev := any(nil)
	if pg > 1 {
		prev = pg - 1
	}
	return start, end, map[string]any{"pagination": map[string]any{"page": pg, "per_page": per, "previous_page": prev, "next_page": next, "last_page": last, "total_entries": n}}, nil
}

func (a *API) listServers(q url.Values) (int, any, *Error) {
	var matched []*Server
	for _, s := range a.servers {
		if (q.Get("name") == "" || s.Name == q.Get("name")) && selects(q.Get("label_selector"), s.Labels) {
			matched = append(matched, s)
		}
	}
	sort.Slice(matched, func(i, j int) bool { return matched[i].ID < matched[j].ID })
	start, end, meta, e := a.page(q, len(matched))
	if e != nil {
		return 0, nil, e
	}
	out := []any{}
	for _, s := range matched[start:end] {
		out = append(out, serverJSON(s))
	}
	return 200, map[string]any{"servers": out, "meta": meta}, nil
}

type ruleJSON struct {
	Direction      string   `json:"direction"`
	Protocol       string   `json:"protocol"`
	Port           *string  `json:"port,omitempty"`
	SourceIPs      []string `json:"source_ips"`
	DestinationIPs []string `json:"destination_ips"`
	Description    *string  `json:"description,omitempty"`
}

func rulesOf(in []ruleJSON) ([]Rule, *Error) {
	var out []Rule
	for _, r := range in {
		rule := Rule{Direction: r.Direction, Protocol: r.Protocol}
		if r.Port != nil {
			rule.Port = *r.Port
		}
		if r.Description != nil {
			rule.Description = *r.Description
		}
		ips := r.SourceIPs
		if r.Direction == "out" {
			ips = r.DestinationIPs
		}
		switch {
		case r.Direction != "in" && r.Direction != "out":
			return nil, errorf(400, "invalid_input", "invalid input in field 'direction'")
		case !slices.Contains([]string{"tcp", "udp", "icmp", "esp", "gre"}, r.Protocol):
			return nil, errorf(400, "invalid_input", "invalid input in field 'protocol'")
		case (r.Protocol == "tcp" || r.Protocol == "udp") && rule.Port == "":
			return nil, errorf(400, "invalid_input", "invalid input in field 'port': required for tcp and udp")
		case len(ips) == 0:
			return nil, errorf(400, "invalid_input", "invalid input in field 'source_ips': at least one")
		}
		for _, ip := range ips {
			if p, err := netip.ParsePrefix(ip); err != nil || p.Masked() != p {
				return nil, errorf(400, "invalid_input", "invalid input in field 'source_ips': %q is not a network", ip)
			}
		}
		rule.IPs = slices.Clone(ips)
		out = append(out, rule)
	}
	return out, nil
}

func (f *Firewall) json() map[string]any {
	rules := []any{}
	for _, r := range f.Rules {
		m := map[string]any{"direction": r.Direction, "protocol": r.Protocol, "port": nil, "description": nil, "source_ips": []string{}, "destination_ips": []string{}}
		if r.Port != "" {
			m["port"] = r.Port
		}
		if r.Description != "" {
			m["description"] = r.Description
		}
		if r.Direction == "in" {
			m["source_ips"] = slices.Clone(r.IPs)
		} else {
			m["destination_ips"] = slices.Clone(r.IPs)
		}
		rules = append(rules, m)
	}
	labels := f.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return map[string]any{"id": f.ID, "name": f.Name, "labels": labels, "created": "2026-12-01T00:00:00Z", "rules": rules, "applied_to": []any{}}
}

func (a *API) listFirewalls(q url.Values) (int, any, *Error) {
	var matched []*Firewall
	for _, f := range a.firewalls {
		if (q.Get("name") == "" || f.Name == q.Get("name")) && selects(q.Get("label_selector"), f.Labels) {
			matched = append(matched, f)
		}
	}
	sort.Slice(matched, func(i, j int) bool { return matched[i].ID < matched[j].ID })
	start, end, meta, e := a.page(q, len(matched))
	if e != nil {
		return 0, nil, e
	}
	out := []any{}
	for _, f := range matched[start:end] {
		out = append(out, f.json())
	}
	return 200, map[string]any{"firewalls": out, "meta": meta}, nil
}

func (a *API) createFirewall(body []byte) (int, any, *Error) {
	var in struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
		Rules  []ruleJSON        `json:"rules"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return 0, nil, errorf(400, "json_error", "%v", err)
	}
	if in.Name == "" || len(in.Name) > 128 {
		return 0, nil, errorf(400, "invalid_input", "invalid input in field 'name'")
	}
	if e := checkLabels(in.Labels); e != nil {
		return 0, nil, e
	}
	for _, f := range a.firewalls {
		if f.Name == in.Name {
			return 0, nil, errorf(409, "uniqueness_error", "firewall name is already used")
		}
	}
	rules, e := rulesOf(in.Rules)
	if e != nil {
		return 0, nil, e
	}
	a.seq++
	f := &Firewall{ID: a.seq, Name: in.Name, Labels: cloneMap(in.Labels), Rules: rules}
	a.firewalls[f.ID] = f
	return 201, map[string]any{"firewall": f.json(), "actions": []any{}}, nil
}

func writeError(w http.ResponseWriter, e Error) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Correlation-Id", "6c1e2c6a9f1b4d2e")
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": e.Code, "message": e.Message, "details": map[string]any{}}})
}
