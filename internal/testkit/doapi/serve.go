package doapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// serve routes one request, checks its token, fails or holds it as the test
// asked, else carries it out and answers DigitalOcean's JSON.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, Error{Status: 400, ID: "bad_request", Message: err.Error()})
		return
	}
	op, id := route(r.Method, r.URL.Path)
	s.mu.Lock()
	s.calls = append(s.calls, Call{Op: op, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: string(body), Authorization: r.Header.Get("Authorization")})
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || !s.tokens[token] {
		s.mu.Unlock()
		writeError(w, Error{Status: 401, ID: "Unauthorized", Message: "Unable to authenticate you"})
		return
	}
	if op == "" {
		s.mu.Unlock()
		writeError(w, Error{Status: 404, ID: "not_found", Message: "The resource you were accessing could not be found."})
		return
	}
	if e, ok := s.Before(op); ok {
		s.mu.Unlock()
		writeError(w, e)
		return
	}
	status, answer, e := s.do(op, id, r.URL.Query(), body, "http://"+r.Host)
	var (
		after *Error
		hang  bool
	)
	if e == nil {
		after, hang = s.After(op)
	}
	s.mu.Unlock()
	switch {
	case e != nil:
		writeError(w, *e)
	case after != nil:
		writeError(w, *after)
	case hang:
		<-r.Context().Done()
	case answer == nil:
		w.WriteHeader(status)
	default:
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(answer)
	}
}

// route names the operation of a method and path, and the ID it names.
func route(method, path string) (op, id string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) < 2 || parts[0] != "v2" {
		return "", ""
	}
	switch {
	case parts[1] == "droplets" && len(parts) == 2 && method == http.MethodGet:
		return ListDroplets, ""
	case parts[1] == "droplets" && len(parts) == 2 && method == http.MethodPost:
		return CreateDroplet, ""
	case parts[1] == "droplets" && len(parts) == 3 && method == http.MethodGet:
		return GetDroplet, parts[2]
	case parts[1] == "droplets" && len(parts) == 3 && method == http.MethodDelete:
		return DeleteDroplet, parts[2]
	case parts[1] == "firewalls" && len(parts) == 2 && method == http.MethodGet:
		return ListFirewalls, ""
	case parts[1] == "firewalls" && len(parts) == 2 && method == http.MethodPost:
		return CreateFirewall, ""
	case parts[1] == "firewalls" && len(parts) == 3 && method == http.MethodPut:
		return UpdateFirewall, parts[2]
	case parts[1] == "tags" && len(parts) == 2 && method == http.MethodPost:
		return CreateTag, ""
	}
	return "", ""
}

func (s *Server) do(op, id string, q url.Values, body []byte, base string) (int, any, *Error) {
	switch op {
	case CreateDroplet:
		return s.createDroplet(body)
	case ListDroplets:
		return s.listDroplets(q, base)
	case GetDroplet:
		d, e := s.dropletByID(id)
		if e != nil {
			return 0, nil, e
		}
		return 200, map[string]any{"droplet": dropletJSON(d)}, nil
	case DeleteDroplet:
		d, e := s.dropletByID(id)
		if e != nil {
			return 0, nil, e
		}
		delete(s.droplets, d.ID)
		return 204, nil, nil
	case ListFirewalls:
		return s.listFirewalls(q, base)
	case CreateFirewall, UpdateFirewall:
		return s.putFirewall(id, body)
	case CreateTag:
		var in struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(body, &in); err != nil || !validTag(in.Name) {
			return 0, nil, unprocessable("name is invalid: tags may contain letters, numbers, colons, dashes, and underscores")
		}
		s.tags[in.Name] = true
		return 201, map[string]any{"tag": map[string]any{"name": in.Name, "resources": map[string]any{"count": 0}}}, nil
	}
	return 0, nil, &Error{Status: 404, ID: "not_found", Message: "The resource you were accessing could not be found."}
}

func unprocessable(format string, args ...any) *Error {
	return &Error{Status: 422, ID: "unprocessable_entity", Message: fmt.Sprintf(format, args...)}
}

func (s *Server) dropletByID(id string) (*Droplet, *Error) {
	n, err := strconv.Atoi(id)
	d, ok := s.droplets[n]
	if err != nil || !ok {
		return nil, &Error{Status: 404, ID: "not_found", Message: "The resource you were accessing could not be found."}
	}
	return d, nil
}

// createRequest is the body of a droplet create, as DigitalOcean reads it.
type createRequest struct {
	Name      string          `json:"name"`
	Region    string          `json:"region"`
	Size      string          `json:"size"`
	Image     json.RawMessage `json:"image"`
	SSHKeys   []any           `json:"ssh_keys"`
	IPv6      bool            `json:"ipv6"`
	UserData  string          `json:"user_data"`
	Tags      []string        `json:"tags"`
	VPCUUID   string          `json:"vpc_uuid"`
	Backups   bool            `json:"backups"`
	Monitor   bool            `json:"monitoring"`
	PrivateNW bool            `json:"private_networking"`
}

func (s *Server) createDroplet(body []byte) (int, any, *Error) {
	var in createRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return 0, nil, &Error{Status: 400, ID: "bad_request", Message: "unable to parse request body: " + err.Error()}
	}
	var image string
	if err := json.Unmarshal(in.Image, &image); err != nil {
		return 0, nil, unprocessable("You specified an invalid image for Droplet creation.")
	}
	switch {
	case in.Name == "" || len(in.Name) > 255 || strings.Trim(strings.ToLower(in.Name), "abcdefghijklmnopqrstuvwxyz0123456789.-") != "":
		return 0, nil, unprocessable("Name is invalid, only a-z, 0-9, . and - are allowed")
	case !slices.Contains(Regions, in.Region):
		return 0, nil, unprocessable("You specified an invalid region for Droplet creation.")
	case !slices.Contains(Sizes, in.Size):
		return 0, nil, unprocessable("You specified an invalid size for Droplet creation.")
	case !slices.Contains(Images, image):
		return 0, nil, unprocessable("You specified an invalid image for Droplet creation.")
	case len(in.UserData) > 64<<10:
		return 0, nil, unprocessable("user_data is too long (maximum is 64 KiB)")
	case s.limit > 0 && len(s.droplets) >= s.limit:
		return 0, nil, &Quota
	}
	for _, t := range in.Tags {
		if !validTag(t) {
			return 0, nil, unprocessable("tag %q is invalid: tags may contain letters, numbers, colons, dashes, and underscores", t)
		}
	}
	s.seq++
	d := &Droplet{ID: s.seq, Name: in.Name, Region: in.Region, Size: in.Size, Image: image, Status: StatusNew,
		WantIPv6: in.IPv6, Tags: slices.Clone(in.Tags), VPCUUID: in.VPCUUID, UserData: in.UserData, Created: time.Now().UTC()}
	for _, k := range in.SSHKeys {
		d.SSHKeys = append(d.SSHKeys, fmt.Sprint(k))
	}
	if s.bootIP != "" {
		d.Status, d.PublicIPv4, d.PrivateIP = StatusActive, s.bootIP, fmt.Sprintf("10.110.0.%d", 2+s.seq%250)
	}
	for _, t := range in.Tags {
		s.tags[t] = true
	}
	s.droplets[d.ID] = d
	return 202, map[string]any{"droplet": dropletJSON(d), "links": map[string]any{"actions": []any{map[string]any{"id": s.seq, "rel": "create", "href": "/v2/actions/" + strconv.Itoa(s.seq)}}}}, nil
}

func dropletJSON(d *Droplet) map[string]any {
	v4 := []any{}
	if d.PublicIPv4 != "" {
		v4 = append(v4, map[string]any{"ip_address": d.PublicIPv4, "netmask": "255.255.240.0", "gateway": "198.51.100.1", "type": "public"})
	}
	if d.PrivateIP != "" {
		v4 = append(v4, map[string]any{"ip_address": d.PrivateIP, "netmask": "255.255.240.0", "gateway": "10.110.0.1", "type": "private"})
	}
	v6 := []any{}
	if d.IPv6 != "" {
		v6 = append(v6, map[string]any{"ip_address": d.IPv6, "netmask": 64, "gateway": "2001:db8::1", "type": "public"})
	}
	features := []string{}
	if d.WantIPv6 {
		features = append(features, "ipv6")
	}
	return map[string]any{
		"id": d.ID, "name": d.Name, "memory": 512, "vcpus": 1, "disk": 10, "locked": false, "status": d.Status,
		"created_at": d.Created.Format(time.RFC3339), "features": features, "backup_ids": []int{}, "snapshot_ids": []int{}, "volume_ids": []string{},
		"image":     map[string]any{"slug": d.Image, "distribution": "Debian", "public": true},
		"size":      map[string]any{"slug": d.Size},
		"size_slug": d.Size,
		"region":    map[string]any{"slug": d.Region, "name": d.Region, "available": true},
		"networks":  map[string]any{"v4": v4, "v6": v6},
		"tags":      slices.Clone(d.Tags), "vpc_uuid": d.VPCUUID,
	}
}

// page cuts n items into the page q asks for and returns its bounds and
// the links DigitalOcean answers with.
func (s *Server) page(q url.Values, n int, base, path string) (start, end int, links map[string]any, e *Error) {
	per := s.pageSize
	if v := q.Get("per_page"); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 200 {
			return 0, 0, nil, &Error{Status: 400, ID: "bad_request", Message: "per_page must be between 1 and 200"}
		}
		per = min(per, p)
	}
	pg := 1
	if v := q.Get("page"); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 {
			return 0, 0, nil, &Error{Status: 400, ID: "bad_request", Message: "page must be a positive integer"}
		}
		pg = p
	}
	start, end = min((pg-1)*per, n), min(pg*per, n)
	pages := map[string]any{}
	if end < n {
		next := url.Values{}
		for k, v := range q {
			next[k] = v
		}
		next.Set("page", strconv.Itoa(pg+1))
		next.Set("per_page", strconv.Itoa(per))
		pages["next"] = base + path + "?" + next.Encode()
	}
	return start, end, map[string]any{"pages": pages}, nil
}

func (s *Server) listDroplets(q url.Values, base string) (int, any, *Error) {
	name, tag := q.Get("name"), q.Get("tag_name")
	if name != "" && tag != "" {
		return 0, nil, &Error{Status: 400, ID: "bad_request", Message: "name and tag_name may not be combined"}
	}
	var matched []*Droplet
	for _, d := range s.droplets {
		if (name == "" || d.Name == name) && (tag == "" || slices.Contains(d.Tags, tag)) {
			matched = append(matched, d)
		}
	}
	sort.Slice(matched, func(i, j int) bool { return matched[i].ID < matched[j].ID })
	start, end, links, e := s.page(q, len(matched), base, "/v2/droplets")
	if e != nil {
		return 0, nil, e
	}
	out := []any{}
	for _, d := range matched[start:end] {
		out = append(out, dropletJSON(d))
	}
	return 200, map[string]any{"droplets": out, "links": links, "meta": map[string]any{"total": len(matched)}}, nil
}

type rulesJSON struct {
	Protocol     string `json:"protocol"`
	Ports        string `json:"ports"`
	Sources      *addrs `json:"sources,omitempty"`
	Destinations *addrs `json:"destinations,omitempty"`
}

type addrs struct {
	Addresses []string `json:"addresses,omitempty"`
	Tags      []string `json:"tags,omitempty"`
}

type firewallJSON struct {
	ID            string      `json:"id"`
	Name          string      `json:"name"`
	Status        string      `json:"status"`
	InboundRules  []rulesJSON `json:"inbound_rules"`
	OutboundRules []rulesJSON `json:"outbound_rules"`
	DropletIDs    []int       `json:"droplet_ids"`
	Tags          []string    `json:"tags"`
	Created       string      `json:"created_at"`
}

func (f *Firewall) json() firewallJSON {
	out := firewallJSON{ID: f.ID, Name: f.Name, Status: "succeeded", Tags: slices.Clone(f.Tags), DropletIDs: []int{}, Created: "2026-12-01T00:00:00Z",
		InboundRules: []rulesJSON{}, OutboundRules: []rulesJSON{}}
	for _, r := range f.Inbound {
		out.InboundRules = append(out.InboundRules, rulesJSON{Protocol: r.Protocol, Ports: r.Ports, Sources: &addrs{Addresses: slices.Clone(r.Addresses)}})
	}
	for _, r := range f.Outbound {
		out.OutboundRules = append(out.OutboundRules, rulesJSON{Protocol: r.Protocol, Ports: r.Ports, Destinations: &addrs{Addresses: slices.Clone(r.Addresses)}})
	}
	if out.Tags == nil {
		out.Tags = []string{}
	}
	return out
}

func (s *Server) listFirewalls(q url.Values, base string) (int, any, *Error) {
	all := make([]*Firewall, 0, len(s.firewalls))
	for _, f := range s.firewalls {
		all = append(all, f)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	start, end, links, e := s.page(q, len(all), base, "/v2/firewalls")
	if e != nil {
		return 0, nil, e
	}
	out := []firewallJSON{}
	for _, f := range all[start:end] {
		out = append(out, f.json())
	}
	return 200, map[string]any{"firewalls": out, "links": links, "meta": map[string]any{"total": len(all)}}, nil
}

// putFirewall creates (id "") or replaces a firewall, refusing rules and
// tags DigitalOcean refuses.
func (s *Server) putFirewall(id string, body []byte) (int, any, *Error) {
	var in firewallJSON
	if err := json.Unmarshal(body, &in); err != nil {
		return 0, nil, &Error{Status: 400, ID: "bad_request", Message: "unable to parse request body: " + err.Error()}
	}
	if in.Name == "" || len(in.Name) > 255 {
		return 0, nil, unprocessable("name is required")
	}
	f := &Firewall{Name: in.Name, Tags: slices.Clone(in.Tags)}
	for _, t := range in.Tags {
		if !s.tags[t] {
			return 0, nil, unprocessable("tag %q does not exist", t)
		}
	}
	for dir, rules := range map[string][]rulesJSON{"inbound": in.InboundRules, "outbound": in.OutboundRules} {
		for _, r := range rules {
			var a *addrs
			if dir == "inbound" {
				a = r.Sources
			} else {
				a = r.Destinations
			}
			switch {
			case !slices.Contains([]string{"tcp", "udp", "icmp"}, r.Protocol):
				return 0, nil, unprocessable("%s rule protocol %q is not tcp, udp or icmp", dir, r.Protocol)
			case r.Protocol != "icmp" && r.Ports == "":
				return 0, nil, unprocessable("%s rule ports must be given for %s", dir, r.Protocol)
			case a == nil || len(a.Addresses)+len(a.Tags) == 0:
				return 0, nil, unprocessable("%s rule has no addresses", dir)
			}
			rule := Rule{Protocol: r.Protocol, Ports: r.Ports, Addresses: slices.Clone(a.Addresses)}
			if dir == "inbound" {
				f.Inbound = append(f.Inbound, rule)
			} else {
				f.Outbound = append(f.Outbound, rule)
			}
		}
	}
	status := 200
	if id == "" {
		f.ID = s.newUUID()
		status = 202
	} else {
		if _, ok := s.firewalls[id]; !ok {
			return 0, nil, &Error{Status: 404, ID: "not_found", Message: "The resource you were accessing could not be found."}
		}
		f.ID = id
	}
	s.firewalls[f.ID] = f
	return status, map[string]any{"firewall": f.json()}, nil
}

func writeError(w http.ResponseWriter, e Error) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Request-Id", "4d9d8375-3c56-4925-a3e7-eb137fed17e9")
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(map[string]string{"id": e.ID, "message": e.Message, "request_id": "4d9d8375-3c56-4925-a3e7-eb137fed17e9"})
}
