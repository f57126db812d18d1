package pool

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testutil/poll"
)

const secret = "s3cretPW"

func TestParseUpstream(t *testing.T) {
	tests := []struct {
		name     string
		raw      string
		wantName string
		wantURL  string
		wantErr  string
	}{
		{"http with port", "http://10.0.0.1:3128", "10.0.0.1:3128", "http://10.0.0.1:3128", ""},
		{"https with credentials", "https://user:" + secret + "@Proxy.Example.com:8443", "proxy.example.com:8443", "https://user:" + secret + "@proxy.example.com:8443", ""},
		{"socks5", "socks5://127.0.0.1:1080", "127.0.0.1:1080", "socks5://127.0.0.1:1080", ""},
		{"socks5h with user", "socks5h://bob:" + secret + "@127.0.0.1:1080", "127.0.0.1:1080", "socks5h://bob:" + secret + "@127.0.0.1:1080", ""},
		{"scheme is lower-cased, trailing slash dropped", "HTTP://127.0.0.1:3128/", "127.0.0.1:3128", "http://127.0.0.1:3128", ""},
		{"ipv6 host", "http://[2001:db8::1]:3128", "[2001:db8::1]:3128", "http://[2001:db8::1]:3128", ""},
		{"surrounding blanks", "  http://127.0.0.1:3128  ", "127.0.0.1:3128", "http://127.0.0.1:3128", ""},
		{"empty", "", "", "", "empty upstream URL"},
		{"missing scheme", "127.0.0.1:3128", "", "", "missing scheme"},
		{"unsupported scheme", "ftp://127.0.0.1:21", "", "", `unsupported scheme "ftp"`},
		{"missing port", "http://127.0.0.1", "", "", "missing port"},
		{"missing host", "http://:3128", "", "", "missing host"},
		{"port out of range", "http://127.0.0.1:70000", "", "", "out of range"},
		{"port zero", "http://127.0.0.1:0", "", "", "out of range"},
		{"path", "http://127.0.0.1:3128/proxy", "", "", "no path"},
		{"query", "http://127.0.0.1:3128?x=1", "", "", "no query"},
		{"fragment", "http://127.0.0.1:3128#frag", "", "", "no fragment"},
		{"password without user", "http://:" + secret + "@127.0.0.1:3128", "", "", "without a user name"},
		{"malformed with credentials", "http://user:" + secret + "@127.0.0.1:bad", "", "", "malformed URL"},
		{"bad escape in password", "http://user:%zz" + secret + "@127.0.0.1:3128", "", "", "malformed URL"},
		{"credentials without scheme", "user:" + secret + "@127.0.0.1:3128", "", "", "missing scheme"},
		{"malformed without credentials keeps detail", "http://127.0.0.1:bad", "", "", "a port that is not a number"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ParseUpstream(tc.raw)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseUpstream(%q) error = %v, want it to contain %q", tc.raw, err, tc.wantErr)
				}
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error leaks the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseUpstream(%q): %v", tc.raw, err)
			}
			if m.Name != tc.wantName || m.URL.String() != tc.wantURL || m.Direct() {
				t.Errorf("got name %q url %q, want %q %q", m.Name, m.URL, tc.wantName, tc.wantURL)
			}
			if strings.Contains(m.Redacted(), secret) {
				t.Errorf("Redacted() leaks the password: %s", m.Redacted())
			}
		})
	}
}

func TestParseUpstreamsFile(t *testing.T) {
	good := `# upstream pool
http://127.0.0.1:3128 region=eu tier=dc   # trailing comment
  https://bob:` + secret + `@127.0.0.2:3129 name=eu-2 region=eu

socks5://127.0.0.3:1080 zone=europe-west1-b
	# indented comment
`
	ms, err := parseUpstreamsFile(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 {
		t.Fatalf("got %d members, want 3: %+v", len(ms), ms)
	}
	want := []struct {
		name  string
		attrs map[string]string
	}{
		{"127.0.0.1:3128", map[string]string{"region": "eu", "tier": "dc"}},
		{"eu-2", map[string]string{"region": "eu"}},
		{"127.0.0.3:1080", map[string]string{"zone": "europe-west1-b"}},
	}
	for i, w := range want {
		if ms[i].Name != w.name || !maps.Equal(ms[i].Attributes, w.attrs) {
			t.Errorf("member %d = %s %v, want %s %v", i, ms[i].Name, ms[i].Attributes, w.name, w.attrs)
		}
	}
	if p, _ := ms[1].URL.User.Password(); p != secret {
		t.Errorf("credentials not kept for use: %q", p)
	}

	empty, err := parseUpstreamsFile(strings.NewReader("# nothing yet\n\n"))
	if err != nil || empty == nil || len(empty) != 0 {
		t.Errorf("comment-only file = (%v, %v), want an empty list", empty, err)
	}
}

func TestParseUpstreamsFileErrors(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  []string
	}{
		{"bad URL names its line", "http://127.0.0.1:3128\n\nhttp://127.0.0.1\n", []string{"line 3:", "missing port"}},
		{"not key=value", "http://127.0.0.1:3128 region\n", []string{"line 1:", `"region" is not key=value`}},
		{"empty key", "http://127.0.0.1:3128 =eu\n", []string{"line 1:", "empty key"}},
		{"empty value", "http://127.0.0.1:3128 region=\n", []string{"line 1:", "empty value"}},
		{"reserved key", "http://127.0.0.1:3128 session=x\n", []string{"line 1:", `"session" is reserved`}},
		{"every username parameter is reserved", "http://127.0.0.1:3128 pace=2s\nhttp://127.0.0.2:3128 strict=1\n", []string{"line 1:", `"pace" is reserved`, "line 2:", `"strict" is reserved`}},
		{"bad value characters", "http://127.0.0.1:3128 region=e,u\n", []string{"line 1:", "value"}},
		{"bad name", "http://127.0.0.1:3128 name=a;b\n", []string{"line 1:", "name"}},
		{"attribute twice", "http://127.0.0.1:3128 a=1 a=2\n", []string{"line 1:", "given twice"}},
		{"name twice (the last one won, silently)", "http://127.0.0.1:3128 name=a name=b\n", []string{"line 1:", "name given twice"}},
		{"duplicate default names", "http://127.0.0.1:3128\n# c\nhttp://127.0.0.1:3128\n", []string{"line 3:", "duplicate member name", "first on line 1"}},
		{"duplicate explicit names", "http://127.0.0.1:3128 name=x\nhttp://127.0.0.2:3128 name=x\n", []string{"line 2:", `"x"`}},
		{"every error is reported", "http://a\nhttp://127.0.0.1:3128\nftp://b:1\n", []string{"line 1:", "line 3:"}},
		{"password never shown", "http://u:" + secret + "@127.0.0.1:3128 oops\nhttp://u:" + secret + "@127.0.0.1:x\n", []string{"line 1:", "line 2:", "u:xxxxx@"}},
		{"overlong line", "http://127.0.0.1:3128\n" + strings.Repeat("x", maxUpstreamsLine+1) + "\n", []string{"line 2:", "longer than"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := parseUpstreamsFile(strings.NewReader(tc.input))
			if err == nil {
				t.Fatalf("no error, members %+v", ms)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error leaks the password: %v", err)
			}
			if ms != nil {
				t.Errorf("members returned with an error: %+v", ms)
			}
		})
	}
}

func TestEgressMember(t *testing.T) {
	tests := []struct {
		in       string
		wantName string
		wantAddr string
		wantErr  bool
	}{
		{"127.0.0.2", "egress-127.0.0.2", "127.0.0.2", false},
		{"2001:DB8::10", "egress-2001:db8::10", "2001:db8::10", false},
		{"::ffff:10.0.0.1", "egress-10.0.0.1", "10.0.0.1", false},
		{"0.0.0.0", "", "", true},
		{"::", "", "", true},
		{"224.0.0.1", "", "", true},
		{"example.com", "", "", true},
		{"", "", "", true},
	}
	for _, tc := range tests {
		t.Run("address "+tc.in, func(t *testing.T) {
			m, err := EgressMember(tc.in)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "egress address") {
					t.Fatalf("EgressMember(%q) = %+v, %v; want an error naming the address", tc.in, m, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Name != tc.wantName || m.SourceAddr != netip.MustParseAddr(tc.wantAddr) || !m.Direct() {
				t.Errorf("EgressMember(%q) = %+v", tc.in, m)
			}
		})
	}
}

func TestDirectMember(t *testing.T) {
	m := DirectMember()
	if m.Name != "direct" || !m.Direct() || m.SourceAddr.IsValid() {
		t.Errorf("DirectMember = %+v", m)
	}
}

func TestMergeMembers(t *testing.T) {
	a, b, c := Member{Name: "a"}, Member{Name: "b"}, Member{Name: "c"}
	got, err := MergeMembers([]Member{a, b}, []Member{c})
	if err != nil || len(got) != 3 || got[0].Name != "a" || got[2].Name != "c" {
		t.Errorf("MergeMembers = %+v, %v", got, err)
	}
	if _, err := MergeMembers([]Member{a, b}, []Member{b}); err == nil || !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("duplicate across sources: %v, want an error naming b", err)
	}
	if _, err := MergeMembers([]Member{a, a}, nil); err == nil {
		t.Error("duplicate within the static members was accepted")
	}
}

// memberSink collects FileSource callbacks.
type memberSink struct {
	mu      sync.Mutex
	changes [][]Member
	errs    []error
}

func (s *memberSink) onChange(ms []Member) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changes = append(s.changes, ms)
}

func (s *memberSink) onError(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, err)
}

func (s *memberSink) snapshot() ([][]Member, []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.changes), slices.Clone(s.errs)
}

func names(ms []Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Write a temp file and rename, as editors and ConfigMap updates do.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestFileSourceReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "upstreams")
	writeFile(t, path, "http://127.0.0.1:3128 name=one\n")
	sink := &memberSink{}
	fs := NewFileSource(path, FileSourceOptions{
		Static:   []Member{DirectMember()},
		Interval: 10 * time.Millisecond,
		OnChange: sink.onChange,
		OnError:  sink.onError,
	})
	initial, err := fs.Load()
	if err != nil {
		t.Fatal(err)
	}
	if got := names(initial); !slices.Equal(got, []string{"direct", "one"}) {
		t.Fatalf("initial members = %v", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fs.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// Unchanged file: no callback after Load.
	time.Sleep(50 * time.Millisecond)
	if ch, _ := sink.snapshot(); len(ch) != 0 {
		t.Fatalf("callback without a change: %v", ch)
	}

	// A change is delivered, merged with the static members.
	writeFile(t, path, "http://127.0.0.1:3128 name=one\nhttp://127.0.0.2:3128 name=two region=eu\n")
	poll.Until(t, 20*time.Second, "the reload with two", func() error {
		ch, _ := sink.snapshot()
		return poll.Check(len(ch) == 1, "%d member changes", len(ch))
	})
	ch, _ := sink.snapshot()
	if got := names(ch[0]); !slices.Equal(got, []string{"direct", "one", "two"}) || ch[0][2].Attributes["region"] != "eu" {
		t.Fatalf("reloaded members = %v %+v", got, ch[0])
	}

	// A broken file keeps the previous members and reports the error once.
	writeFile(t, path, "http://127.0.0.1:3128 name=one\nhttp://127.0.0.3 name=three\n")
	poll.Until(t, 20*time.Second, "the load error", func() error {
		_, errs := sink.snapshot()
		return poll.Check(len(errs) >= 1, "errors %v", errs)
	})
	time.Sleep(100 * time.Millisecond) // several polls of the same broken file
	ch, errs := sink.snapshot()
	if len(ch) != 1 {
		t.Errorf("a broken file produced a member change: %v", ch)
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "line 2") || !strings.Contains(errs[0].Error(), path) {
		t.Errorf("errors = %v, want one naming the file and line 2", errs)
	}

	// A duplicate of a static name is a merge error, also keeping the old members.
	writeFile(t, path, "http://127.0.0.1:3128 name=direct\n")
	poll.Until(t, 20*time.Second, "the merge error", func() error {
		_, errs := sink.snapshot()
		return poll.Check(len(errs) == 2, "errors %v", errs)
	})
	if _, errs := sink.snapshot(); !strings.Contains(errs[1].Error(), `duplicate member name "direct"`) {
		t.Errorf("merge error = %v", errs[1])
	}

	// A missing file is an error too; fixing it delivers the new members.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "the missing-file error", func() error {
		_, errs := sink.snapshot()
		return poll.Check(len(errs) == 3, "errors %v", errs)
	})
	writeFile(t, path, "http://127.0.0.4:3128 name=four\n")
	poll.Until(t, 20*time.Second, "the reload with four", func() error {
		ch, _ := sink.snapshot()
		return poll.Check(len(ch) == 2, "%d member changes", len(ch))
	})
	ch, errs = sink.snapshot()
	if got := names(ch[1]); !slices.Equal(got, []string{"direct", "four"}) {
		t.Errorf("members after the fix = %v", got)
	}
	if len(errs) != 3 {
		t.Errorf("errors = %v, want exactly 3", errs)
	}
}

func TestFileSourceSameContentRewrittenIsNoChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "upstreams")
	content := "http://127.0.0.1:3128\n"
	writeFile(t, path, content)
	sink := &memberSink{}
	fs := NewFileSource(path, FileSourceOptions{Interval: 10 * time.Millisecond, OnChange: sink.onChange, OnError: sink.onError})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fs.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// Without Load, Run delivers the first read.
	poll.Until(t, 20*time.Second, "the first load", func() error {
		ch, _ := sink.snapshot()
		return poll.Check(len(ch) == 1, "%d member changes", len(ch))
	})
	// Touch with identical content (new mtime): the hash says nothing changed.
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, future, future); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if ch, errs := sink.snapshot(); len(ch) != 1 || len(errs) != 0 {
		t.Errorf("after touching: %d changes, errors %v; want 1 change, no errors", len(ch), errs)
	}
}

func TestFileSourceLoadReportsABadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "upstreams")
	writeFile(t, path, "nonsense\n")
	_, err := NewFileSource(path, FileSourceOptions{}).Load()
	if err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("Load of a bad file = %v, want a line-numbered error", err)
	}
	_, err = NewFileSource(filepath.Join(t.TempDir(), "missing"), FileSourceOptions{}).Load()
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file = %v, want ErrNotExist", err)
	}
}
