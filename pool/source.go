package pool

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/redact"
)

// DirectMemberName is the name of the member that dials targets itself; it
// is the whole pool when nothing else is configured.
const DirectMemberName = "direct"

// DefaultFilePollInterval is how often a FileSource checks its file.
const DefaultFilePollInterval = 2 * time.Second

// maxUpstreamsLine bounds one line of an upstreams file.
const maxUpstreamsLine = 64 << 10

// ReservedAttributeKey reports keys that are a gateway's username (and
// header) parameters: session, sessttl, proxy, rotate, pace, strict. An
// attribute with such a key could never be selected, since the parameter
// takes the key, so an upstreams file refuses it; the gateway's parameter
// parser asks this same list.
func ReservedAttributeKey(k string) bool {
	switch k {
	case "session", "sessttl", "proxy", "rotate", "pace", "strict":
		return true
	}
	return false
}

// ParseUpstream parses one upstream proxy URL: http://, https://, socks5://
// or socks5h://, optionally with user:password, always with an explicit port
// (tools disagree on default proxy ports - curl assumes 1080 for every
// scheme, Go 80/443/1080 - so a missing port is an error, not a guess). The
// member's name is host:port with the host lower-cased. Errors never contain
// the password.
func ParseUpstream(raw string) (Member, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return Member{}, errors.New("empty upstream URL")
	}
	shown := redact.URL(raw)
	if !strings.Contains(raw, "://") {
		return Member{}, fmt.Errorf("upstream %s: missing scheme (want http://, https://, socks5:// or socks5h://, e.g. http://%s)", shown, shown)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Member{}, fmt.Errorf("upstream %s: %s", shown, redact.Reason(raw, err))
	}
	scheme := strings.ToLower(u.Scheme)
	switch scheme {
	case "http", "https", "socks5", "socks5h":
	default:
		return Member{}, fmt.Errorf("upstream %s: unsupported scheme %q (want http, https, socks5 or socks5h)", shown, u.Scheme)
	}
	host, port := u.Hostname(), u.Port()
	switch {
	case host == "":
		return Member{}, fmt.Errorf("upstream %s: missing host", shown)
	case port == "":
		return Member{}, fmt.Errorf("upstream %s: missing port (write it explicitly, e.g. %s://%s:3128)", shown, scheme, u.Host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return Member{}, fmt.Errorf("upstream %s: port %q out of range 1..65535", shown, port)
	}
	switch {
	case u.Path != "" && u.Path != "/":
		return Member{}, fmt.Errorf("upstream %s: a proxy URL has no path (%q)", shown, u.Path)
	case u.RawQuery != "" || u.ForceQuery:
		return Member{}, fmt.Errorf("upstream %s: a proxy URL has no query", shown)
	case u.Fragment != "":
		return Member{}, fmt.Errorf("upstream %s: a proxy URL has no fragment", shown)
	}
	if u.User != nil && u.User.Username() == "" {
		return Member{}, fmt.Errorf("upstream %s: credentials without a user name", shown)
	}
	host = strings.ToLower(host)
	clean := &url.URL{Scheme: scheme, User: u.User, Host: net.JoinHostPort(host, port)}
	return Member{Name: clean.Host, URL: clean}, nil
}

// parseUpstreamsFile reads an upstreams file: one member per line,
// `URL [key=value ...]`; `name=` names the member (default host:port), other
// keys are attributes selectors match. `#` starts a comment at the start of
// a line or after a blank. Every problem is reported with its line number,
// all of them at once; duplicate names are an error. Passwords never appear
// in errors.
func parseUpstreamsFile(r io.Reader) ([]Member, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxUpstreamsLine)
	var (
		members []Member
		errs    []error
		seen    = map[string]int{}
		lineNo  int
	)
	for sc.Scan() {
		lineNo++
		fields := strings.Fields(stripComment(sc.Text()))
		if len(fields) == 0 {
			continue
		}
		m, err := parseUpstreamLine(fields)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", lineNo, err))
			continue
		}
		if first, dup := seen[m.Name]; dup {
			errs = append(errs, fmt.Errorf("line %d: duplicate member name %q (first on line %d)", lineNo, m.Name, first))
			continue
		}
		seen[m.Name] = lineNo
		members = append(members, m)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("longer than %d bytes", maxUpstreamsLine)
		}
		errs = append(errs, fmt.Errorf("line %d: %w", lineNo+1, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if members == nil {
		members = []Member{}
	}
	return members, nil
}

// stripComment cuts a line at a '#' that starts it or follows a blank; a '#'
// inside a token (a URL fragment) is left for the URL check to reject.
func stripComment(line string) string {
	for i := 0; i < len(line); i++ {
		if line[i] == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t') {
			return line[:i]
		}
	}
	return line
}

func parseUpstreamLine(fields []string) (Member, error) {
	m, err := ParseUpstream(fields[0])
	if err != nil {
		return Member{}, err
	}
	named := false
	for _, kv := range fields[1:] {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			return Member{}, fmt.Errorf("%q is not key=value", kv)
		case k == "":
			return Member{}, fmt.Errorf("%q has an empty key", kv)
		case v == "":
			return Member{}, fmt.Errorf("%q has an empty value", kv)
		}
		if k == "name" {
			if !validToken(v, "._:[]-") {
				return Member{}, fmt.Errorf("name %q: use letters, digits and . _ : [ ] -", v)
			}
			if named {
				return Member{}, errors.New("name given twice")
			}
			m.Name, named = v, true
			continue
		}
		if ReservedAttributeKey(k) {
			return Member{}, fmt.Errorf("attribute key %q is reserved (a username parameter)", k)
		}
		if !validToken(k, "._/-") {
			return Member{}, fmt.Errorf("attribute key %q: use letters, digits and . _ / -", k)
		}
		if !validToken(v, "._:/-") {
			return Member{}, fmt.Errorf("attribute %s value %q: use letters, digits and . _ : / -", k, v)
		}
		if m.Attributes == nil {
			m.Attributes = map[string]string{}
		}
		if _, dup := m.Attributes[k]; dup {
			return Member{}, fmt.Errorf("attribute %q given twice", k)
		}
		m.Attributes[k] = v
	}
	return m, nil
}

func validToken(s, extra string) bool {
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(extra, r)
		if !ok {
			return false
		}
	}
	return s != ""
}

// EgressMember is a direct member bound to the local source address ip,
// named "egress-<ip>" (e.g. one of many IPv6 addresses on a host).
func EgressMember(ip string) (Member, error) {
	a, err := netip.ParseAddr(strings.TrimSpace(ip))
	if err != nil {
		return Member{}, fmt.Errorf("egress address %q: not an IP address", ip)
	}
	a = a.Unmap()
	if a.IsUnspecified() || a.IsMulticast() {
		return Member{}, fmt.Errorf("egress address %q: must be a unicast address of this host", ip)
	}
	return Member{Name: "egress-" + a.String(), SourceAddr: a}, nil
}

// DirectMember is the member that dials targets itself from any local address.
func DirectMember() Member { return Member{Name: DirectMemberName} }

// MergeMembers joins members from several sources (flags, then the file);
// the same name twice is an error, since names are what pins and reports use.
func MergeMembers(static []Member, file []Member) ([]Member, error) {
	out := make([]Member, 0, len(static)+len(file))
	seen := make(map[string]string, len(static)+len(file))
	add := func(ms []Member, source string) error {
		for _, m := range ms {
			if first, dup := seen[m.Name]; dup {
				return fmt.Errorf("duplicate member name %q (%s and %s)", m.Name, first, source)
			}
			seen[m.Name] = source
			out = append(out, m)
		}
		return nil
	}
	if err := add(static, "flags"); err != nil {
		return nil, err
	}
	if err := add(file, "upstreams file"); err != nil {
		return nil, err
	}
	return out, nil
}

// FileSourceOptions configures a FileSource.
type FileSourceOptions struct {
	// Static members (from flags) are merged before the file's.
	Static []Member
	// Interval between checks of the file (default 2s).
	Interval time.Duration
	// OnChange receives the merged member list after every successful load
	// that changed the file's content.
	OnChange func([]Member)
	// OnError receives load failures; the previous members stay in force.
	// Each distinct failure is reported once, not at every poll.
	OnError func(error)
}

// FileSource watches an upstreams file by polling (size, mtime, then a hash
// of the content) and hands the merged member list to OnChange when the
// content changes. A broken or missing file keeps the previous members.
type FileSource struct {
	path string
	o    FileSourceOptions

	mu      sync.Mutex
	loaded  bool
	size    int64
	mtime   time.Time
	sum     [sha256.Size]byte
	lastErr string
}

// NewFileSource watches path.
func NewFileSource(path string, o FileSourceOptions) *FileSource {
	if o.Interval <= 0 {
		o.Interval = DefaultFilePollInterval
	}
	return &FileSource{path: path, o: o}
}

// Load reads and merges the file now (at startup, to fail fast on a bad
// file) and remembers its state, so Run reports only later changes.
func (f *FileSource) Load() ([]Member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ms, _, err := f.load(true)
	return ms, err
}

// Run polls until ctx ends. If Load was never called (or failed), the first
// successful read is handed to OnChange.
func (f *FileSource) Run(ctx context.Context) {
	t := time.NewTicker(f.o.Interval)
	defer t.Stop()
	for {
		f.poll()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (f *FileSource) poll() {
	f.mu.Lock()
	ms, changed, err := f.load(false)
	f.mu.Unlock()
	if err != nil {
		if f.o.OnError != nil {
			f.o.OnError(err)
		}
		return
	}
	if changed && f.o.OnChange != nil {
		f.o.OnChange(ms)
	}
}

// load reads the file if its stat changed (or force) and its content hash
// differs from the last good load. It returns an error only once per
// distinct failure when called from poll (force=false).
func (f *FileSource) load(force bool) ([]Member, bool, error) {
	fail := func(err error) ([]Member, bool, error) {
		err = fmt.Errorf("upstreams file %s: %w", f.path, err)
		if !force && err.Error() == f.lastErr {
			return nil, false, nil
		}
		f.lastErr = err.Error()
		return nil, false, err
	}
	st, err := os.Stat(f.path)
	if err != nil {
		return fail(err)
	}
	if !force && f.loaded && st.Size() == f.size && st.ModTime().Equal(f.mtime) {
		return nil, false, nil
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		return fail(err)
	}
	sum := sha256.Sum256(data)
	if !force && f.loaded && sum == f.sum {
		f.size, f.mtime = st.Size(), st.ModTime()
		f.lastErr = ""
		return nil, false, nil
	}
	fileMembers, err := parseUpstreamsFile(bytes.NewReader(data))
	if err != nil {
		return fail(err)
	}
	ms, err := MergeMembers(f.o.Static, fileMembers)
	if err != nil {
		return fail(err)
	}
	f.loaded, f.size, f.mtime, f.sum, f.lastErr = true, st.Size(), st.ModTime(), sum, ""
	return ms, true, nil
}
