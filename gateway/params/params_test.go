package params

import (
	"encoding/base64"
	"errors"
	"net/http"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxyfleet/proxyfleet/rotation"
)

func TestParseUsername(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Params
		wantErr string // substring of the error; "" means success
	}{
		{name: "empty username means defaults", in: "", want: Params{}},
		{name: "plain user has no parameters", in: "alice", want: Params{User: "alice"}},
		{name: "hyphen form reads session and selector", in: "alice-session-abc123-region-eu-proxy-px7",
			want: Params{User: "alice", Session: "abc123", Proxy: "px7", Selector: map[string]string{"region": "eu"}}},
		{name: "semicolon form allows hyphens in values", in: "alice;session=abc123;zone=europe-west1-b",
			want: Params{User: "alice", Session: "abc123", Selector: map[string]string{"zone": "europe-west1-b"}}},
		{name: "sessttl as integer seconds", in: "bob-sessttl-90", want: Params{User: "bob", SessTTL: 90 * time.Second}},
		{name: "sessttl as Go duration", in: "bob-sessttl-1m30s", want: Params{User: "bob", SessTTL: 90 * time.Second}},
		{name: "rotate request", in: "bob-rotate-request", want: Params{User: "bob", Rotate: rotation.ModeRequest}},
		{name: "rotate per-request alias in semicolon form", in: "bob;rotate=per-request", want: Params{User: "bob", Rotate: rotation.ModeRequest}},
		{name: "rotate sticky", in: "bob;rotate=sticky", want: Params{User: "bob", Rotate: rotation.ModeSticky}},
		{name: "user may carry dots, underscores and @", in: "a.b_c@x;session=1", want: Params{User: "a.b_c@x", Session: "1"}},

		{name: "odd pair count is refused", in: "alice-session-abc-region", wantErr: "odd number"},
		{name: "trailing hyphen is refused", in: "alice-session-abc-", wantErr: "ends with"},
		{name: "lone trailing hyphen is refused", in: "alice-", wantErr: "ends with"},
		{name: "empty key is refused", in: "alice--x", wantErr: "empty key"},
		{name: "empty value is refused", in: "alice;session=", wantErr: "empty value"},
		{name: "empty semicolon pair is refused", in: "alice;session=a;;x=y", wantErr: "empty ;key=value"},
		{name: "trailing semicolon is refused", in: "alice;session=a;", wantErr: "empty ;key=value"},
		{name: "semicolon pair without equals is refused", in: "alice;session", wantErr: "not key=value"},
		{name: "duplicate session is refused", in: "alice-session-a-session-b", wantErr: "given twice"},
		{name: "duplicate attribute is refused", in: "alice;region=eu;region=us", wantErr: "given twice"},
		{name: "bad character in value is refused", in: "alice;session=a b", wantErr: "character outside"},
		{name: "equals sign inside a value is refused", in: "alice;session=a=b", wantErr: "character outside"},
		{name: "bad character in key is refused", in: "alice;re gion=eu", wantErr: "character outside"},
		{name: "hyphen in user of semicolon form is refused", in: "al-ice;session=a", wantErr: "user name"},
		{name: "empty user before parameters is refused", in: "-session-a", wantErr: "empty user"},
		{name: "bad rotate is refused", in: "alice-rotate-sometimes", wantErr: "want sticky or request"},
		{name: "zero sessttl is refused", in: "alice-sessttl-0", wantErr: "greater than zero"},
		{name: "negative sessttl is refused", in: "alice;sessttl=-5s", wantErr: "greater than zero"},
		{name: "unparsable sessttl is refused", in: "alice-sessttl-soon", wantErr: "want a duration"},
		{name: "overflowing sessttl is refused", in: "alice-sessttl-99999999999999999999", wantErr: "too long"},
		{name: "overlong username is refused", in: "a;x=" + strings.Repeat("y", 2000), wantErr: "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseUsername(tt.in)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("ParseUsername(%q) = %+v, want error containing %q", tt.in, got, tt.wantErr)
				}
				var pe *Error
				if !errors.As(err, &pe) {
					t.Fatalf("error %v is not a *Error", err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %q does not contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseUsername(%q): %v", tt.in, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseUsername(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseHeaders(t *testing.T) {
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	tests := []struct {
		name    string
		in      http.Header
		want    Params
		wantErr string
	}{
		{name: "no headers means defaults", in: h(), want: Params{}},
		{name: "all headers", in: h(HeaderSession, "s-1", HeaderSelect, "region=eu, tier=dc", HeaderProxy, "px-7",
			HeaderRotate, "request", HeaderSessTTL, "30"),
			want: Params{Session: "s-1", Proxy: "px-7", Rotate: rotation.ModeRequest, SessTTL: 30 * time.Second,
				Selector: map[string]string{"region": "eu", "tier": "dc"}}},
		{name: "select lines join as one list", in: h(HeaderSelect, "region=eu", HeaderSelect, "tier=dc"),
			want: Params{Selector: map[string]string{"region": "eu", "tier": "dc"}}},
		{name: "repeated session header is refused", in: h(HeaderSession, "a", HeaderSession, "b"), wantErr: "more than once"},
		{name: "empty session header is refused", in: h(HeaderSession, " "), wantErr: "is empty"},
		{name: "select item without equals is refused", in: h(HeaderSelect, "region"), wantErr: "not key=value"},
		{name: "empty select item is refused", in: h(HeaderSelect, "region=eu,"), wantErr: "empty key=value"},
		{name: "reserved key in select is refused", in: h(HeaderSelect, "session=x"), wantErr: "not an attribute"},
		{name: "duplicate select key is refused", in: h(HeaderSelect, "a=1,a=2"), wantErr: "given twice"},
		{name: "bad rotate header is refused", in: h(HeaderRotate, "never"), wantErr: "want sticky or request"},
		{name: "bad sessttl header is refused", in: h(HeaderSessTTL, "0s"), wantErr: "greater than zero"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHeaders(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseHeaders = %+v, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseHeaders: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseHeaders = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	tests := []struct {
		name     string
		user     string
		hdr      http.Header
		want     Params
		wantErrs string
	}{
		{name: "header fills what the username leaves out", user: "u-session-a",
			hdr:  http.Header{HeaderSelect: {"region=eu"}},
			want: Params{User: "u", Session: "a", Selector: map[string]string{"region": "eu"}}},
		{name: "agreeing values are accepted", user: "u-session-a-region-eu",
			hdr:  http.Header{HeaderSession: {"a"}, HeaderSelect: {"region=eu,tier=dc"}},
			want: Params{User: "u", Session: "a", Selector: map[string]string{"region": "eu", "tier": "dc"}}},
		{name: "disagreeing session is refused", user: "u-session-a", hdr: http.Header{HeaderSession: {"b"}}, wantErrs: "username says"},
		{name: "disagreeing selector is refused", user: "u-region-eu", hdr: http.Header{HeaderSelect: {"region=us"}}, wantErrs: "username says"},
		{name: "disagreeing sessttl is refused", user: "u-sessttl-10", hdr: http.Header{HeaderSessTTL: {"20s"}}, wantErrs: "username says"},
		{name: "disagreeing proxy is refused", user: "u-proxy-a", hdr: http.Header{HeaderProxy: {"b"}}, wantErrs: "username says"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := ParseUsername(tt.user)
			if err != nil {
				t.Fatal(err)
			}
			h, err := ParseHeaders(tt.hdr)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Merge(u, h)
			if tt.wantErrs != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErrs) {
					t.Fatalf("Merge = %+v, %v; want error containing %q", got, err, tt.wantErrs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Merge = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestSessionKeySeparatesUsers(t *testing.T) {
	a := Params{User: "a", Session: "s"}
	b := Params{User: "b", Session: "s"}
	def := Params{User: "a"}
	if a.SessionKey() == b.SessionKey() {
		t.Fatal("two users with the same session name share a session key")
	}
	if a.SessionKey() == def.SessionKey() {
		t.Fatal("a named session shares the user's default session key")
	}
}

func TestParseProxyAuthorization(t *testing.T) {
	enc := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	tests := []struct {
		name      string
		in        string
		user, tok string
		wantErr   bool
	}{
		{name: "user and token", in: enc("alice-session-1:s3cret"), user: "alice-session-1", tok: "s3cret"},
		{name: "token may contain colons", in: enc("a:b:c"), user: "a", tok: "b:c"},
		{name: "scheme is case-insensitive", in: "basic " + base64.StdEncoding.EncodeToString([]byte("a:b")), user: "a", tok: "b"},
		{name: "bearer is refused", in: "Bearer xyz", wantErr: true},
		{name: "bad base64 is refused", in: "Basic !!!", wantErr: true},
		{name: "missing colon is refused", in: enc("alice"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, tok, err := ParseProxyAuthorization(tt.in)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("got %q %q, want error", u, tok)
				}
				if strings.Contains(err.Error(), "xyz") {
					t.Fatal("error text echoes the credential")
				}
				return
			}
			if err != nil || u != tt.user || tok != tt.tok {
				t.Fatalf("got %q %q %v, want %q %q", u, tok, err, tt.user, tt.tok)
			}
		})
	}
}

// canonicalUsername writes p in the ;key=value form with sorted keys.
func canonicalUsername(p Params) string {
	parts := paramPairs(p)
	if len(parts) == 0 {
		return p.User
	}
	return p.User + ";" + strings.Join(parts, ";")
}

func paramPairs(p Params) []string {
	var parts []string
	if p.Session != "" {
		parts = append(parts, "session="+p.Session)
	}
	if p.SessTTL != 0 {
		parts = append(parts, "sessttl="+strconv.FormatInt(int64(p.SessTTL), 10)+"ns")
	}
	if p.Proxy != "" {
		parts = append(parts, "proxy="+p.Proxy)
	}
	if p.Rotate != "" {
		parts = append(parts, "rotate="+string(p.Rotate))
	}
	if p.Pace != 0 {
		parts = append(parts, "pace="+strconv.FormatInt(int64(p.Pace), 10)+"ns")
	}
	if p.strictSet {
		parts = append(parts, "strict="+map[bool]string{true: "1", false: "0"}[p.Strict])
	}
	parts = append(parts, selectorPairs(p.Selector)...)
	return parts
}

func selectorPairs(sel map[string]string) []string {
	var parts []string
	for k, v := range sel {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return parts
}

func checkParamsInvariants(t *testing.T, p Params) {
	t.Helper()
	if p.SessTTL < 0 {
		t.Fatalf("negative sessttl %v", p.SessTTL)
	}
	if p.Rotate != "" && p.Rotate != rotation.ModeSticky && p.Rotate != rotation.ModeRequest {
		t.Fatalf("rotate %q outside the allowed set", p.Rotate)
	}
	for k, v := range p.Selector {
		if isReserved(k) || k == "" || v == "" {
			t.Fatalf("selector has bad pair %q=%q", k, v)
		}
	}
	if p.Selector != nil && len(p.Selector) == 0 {
		t.Fatal("empty non-nil selector")
	}
	if p.Pace < 0 || p.Pace > maxPace {
		t.Fatalf("pace %v outside (0, %v]", p.Pace, maxPace)
	}
	if p.Strict && !p.strictSet {
		t.Fatal("strict without being set")
	}
}

func FuzzParseUsername(f *testing.F) {
	for _, s := range []string{
		"", "alice", "alice-session-abc123-region-eu-proxy-px7", "alice;session=abc123;zone=europe-west1-b",
		"bob-sessttl-90", "bob;sessttl=1m30s;rotate=request", "a-b", "a-b-c", "a;", "a;b", "-x-y", "a--",
		"a;x=1;x=2", "a;sessttl=-1s", "a;rotate=per-request", "a\x00-b-c", "é-session-1",
		"c-pace-2s", "c-strict-1", "c-session-cart-strict-1-pace-500ms", "c;pace=1.5s;strict=0", "c-pace-0",
		"c-pace-2h", "c-pace-90", "c-strict-yes", "c-strict-1-strict-0", "c;pace=-1s",
		"0;pace=1us", // a pace Go prints as "1µs", which a header does not carry: the header says "1us"
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := ParseUsername(in)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *Error", err)
			}
			return
		}
		checkParamsInvariants(t, p)
		if in != "" && p.User == "" {
			t.Fatalf("non-empty username %q parsed to an empty user", in)
		}
		// Round trip: the canonical ;key=value form parses to the same params.
		again, err := ParseUsername(canonicalUsername(p))
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", canonicalUsername(p), in, err)
		}
		if !reflect.DeepEqual(again, p) {
			t.Fatalf("round trip of %q: got %+v, want %+v", in, again, p)
		}
		// Consistency: the same parameters as headers merge to the same params.
		hdr := http.Header{}
		if p.Session != "" {
			hdr.Set(HeaderSession, p.Session)
		}
		if p.Proxy != "" {
			hdr.Set(HeaderProxy, p.Proxy)
		}
		if sel := selectorPairs(p.Selector); len(sel) > 0 {
			hdr.Set(HeaderSelect, strings.Join(sel, ","))
		}
		if p.Pace != 0 {
			// As a client writes it: header values are ASCII, so a pace
			// Go prints in µs is written in us.
			hdr.Set(HeaderPace, strings.ReplaceAll(p.Pace.String(), "µ", "u"))
		}
		if p.strictSet {
			hdr.Set(HeaderStrict, map[bool]string{true: "1", false: "0"}[p.Strict])
		}
		hp, err := ParseHeaders(hdr)
		if err != nil {
			t.Fatalf("headers %v from %q do not parse: %v", hdr, in, err)
		}
		merged, err := Merge(p, hp)
		if err != nil {
			t.Fatalf("merging %q with its own headers: %v", in, err)
		}
		if !reflect.DeepEqual(merged, p) {
			t.Fatalf("merge of %q with its own headers: got %+v, want %+v", in, merged, p)
		}
	})
}

func FuzzParseHeaders(f *testing.F) {
	f.Add("abc", "region=eu,tier=dc", "px-7", "request", "90")
	f.Add("", "a=1, b=2", "", "sticky", "1m")
	f.Add("x y", "session=1", "p", "never", "0")
	f.Add("s", ",,", "", "", "-1s")
	f.Add("s", "a=1,a=2", "\x7f", "", "99999999999999999999")
	f.Fuzz(func(t *testing.T, session, sel, proxy, rotate, sessttl string) {
		hdr := http.Header{}
		for k, v := range map[string]string{HeaderSession: session, HeaderSelect: sel, HeaderProxy: proxy,
			HeaderRotate: rotate, HeaderSessTTL: sessttl} {
			if v != "" {
				hdr.Set(k, v)
			}
		}
		p, err := ParseHeaders(hdr)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *Error", err)
			}
			return
		}
		checkParamsInvariants(t, p)
		if p.User != "" {
			t.Fatalf("headers set a user %q", p.User)
		}
		// Round trip through the canonical username form. Each header has
		// the username's length limit, so together they can say more than
		// one username may: then the username form is refused for its length
		// and nothing else.
		p.User = "u"
		canon := canonicalUsername(p)
		again, err := ParseUsername(canon)
		if len(canon) > maxUsernameLen {
			if err == nil || !strings.Contains(err.Error(), "longer than") {
				t.Fatalf("a %d-byte canonical form: %v, want the length refusal", len(canon), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("canonical form %q does not parse: %v", canon, err)
		}
		if !reflect.DeepEqual(again, p) {
			t.Fatalf("round trip: got %+v, want %+v", again, p)
		}
	})
}

// FuzzParsePaceHeaders: the pace and strict headers, beside a username
// that may say the same or otherwise, parse to a *Error or to Params
// whose merge keeps each value of either. (That the gateway's pacer never
// makes the merged pace looser is package gateway's
// FuzzClientPaceMeetsTheOperators.)
func FuzzParsePaceHeaders(f *testing.F) {
	f.Add("crawler-pace-2s", "2s", "1")
	f.Add("crawler", "500ms", "0")
	f.Add("crawler-strict-1", "", "0")
	f.Add("crawler-pace-1s", "2s", "")
	f.Add("c", "90", "true")
	f.Add("c", "-1s", "2")
	f.Add("c", "1000000h", "")
	f.Add("c;pace=1m", "1m0s", "1")
	f.Fuzz(func(t *testing.T, user, pace, strict string) {
		hdr := http.Header{}
		if pace != "" {
			hdr.Set(HeaderPace, pace)
		}
		if strict != "" {
			hdr.Set(HeaderStrict, strict)
		}
		up, err := ParseUsername(user)
		if err != nil {
			return
		}
		hp, err := ParseHeaders(hdr)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *Error", err)
			}
			return
		}
		checkParamsInvariants(t, hp)
		p, err := Merge(up, hp)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *Error", err)
			}
			return
		}
		checkParamsInvariants(t, p)
		if (up.Pace != 0 && p.Pace != up.Pace) || (hp.Pace != 0 && p.Pace != hp.Pace) {
			t.Fatalf("merged pace %v from username %v and header %v", p.Pace, up.Pace, hp.Pace)
		}
		if (up.strictSet && p.Strict != up.Strict) || (hp.strictSet && p.Strict != hp.Strict) {
			t.Fatalf("merged strict %v from username %v and header %v", p.Strict, up.Strict, hp.Strict)
		}
	})
}

// TestREADMEUsernameExamplesParse keeps the README's username examples and
// the 407 message it quotes in step with the parser.
func TestREADMEUsernameExamplesParse(t *testing.T) {
	for _, u := range []string{
		"crawler-session-abc123-region-eu-proxy-px7",
		"crawler;session=abc123;zone=europe-west1-b",
		"crawler-session-s42",
	} {
		if _, err := ParseUsername(u); err != nil {
			t.Errorf("README example %q does not parse: %v", u, err)
		}
	}
	_, err := ParseUsername("crawler-session-abc!")
	want := `value of "session" in username has a character outside [A-Za-z0-9_.:/] (use user;key=value for values with '-')`
	if err == nil || err.Error() != want {
		t.Errorf("README quotes the 407 message %q, the parser says %v", want, err)
	}
	raw, _ := os.ReadFile("../../README.md")
	if !strings.Contains(strings.Join(strings.Fields(string(raw)), " "), "proxyfleet: "+want) {
		t.Errorf("README no longer quotes %q", want)
	}
}

// The pool refuses an attribute the parser would read as a parameter: the
// two must name the same keys, or an upstreams-file attribute could be
// accepted and never selectable (pace and strict once were).
func TestEveryParameterKeyIsReserved(t *testing.T) {
	for _, k := range []string{keySession, keySessTTL, keyProxy, keyRotate, keyPace, keyStrict} {
		if !isReserved(k) {
			t.Errorf("parameter key %q is not a reserved attribute key", k)
		}
	}
	for _, k := range []string{"region", "tier", "name", "zone"} {
		if isReserved(k) {
			t.Errorf("attribute key %q is reserved", k)
		}
	}
}
