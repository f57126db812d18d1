// Package params reads what a crawler asks of the gateway for one request:
// the parameters its proxy username carries (user-session-s1-region-eu, or
// user;session=s1;zone=europe-west1-b), its X-Proxyfleet-* request headers,
// and the credentials of its Proxy-Authorization header. ParseUsername,
// ParseHeaders and Merge give a Params; everything malformed is an *Error
// whose message is safe to send back to the client, never a silent default.
//
// It is pure: no I/O, no state, no logging. It must not import the gateway
// or anything that leases, dials or records; package gateway turns an
// *Error into its 407 answer.
package params

import (
	"encoding/base64"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/gateway/internal/echo"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// Header names a client uses to talk to the gateway instead of (or besides)
// username parameters. Every request header starting with HeaderPrefix is
// stripped before forwarding.
const (
	// HeaderSession names the sticky session (same as the `session` parameter).
	HeaderSession = "X-Proxyfleet-Session"
	// HeaderSelect is an attribute selector list: `region=eu,tier=dc`.
	HeaderSelect = "X-Proxyfleet-Select"
	// HeaderProxy pins the request to one member by name (the `proxy` parameter).
	HeaderProxy = "X-Proxyfleet-Proxy"
	// HeaderRotate is `sticky` or `request` (the `rotate` parameter).
	HeaderRotate = "X-Proxyfleet-Rotate"
	// HeaderSessTTL is how long the session keeps its member (the `sessttl` parameter).
	HeaderSessTTL = "X-Proxyfleet-Sessttl"
	// HeaderPace is the client's own pace for the site (the `pace`
	// parameter): a duration between two requests through one member,
	// met with the operator's (the stricter wins).
	HeaderPace = "X-Proxyfleet-Pace"
	// HeaderStrict set to 1 keeps the session on its member: when the
	// member is banned, fails or leaves, the request fails session_lost
	// instead of moving (the `strict` parameter).
	HeaderStrict = "X-Proxyfleet-Strict"

	// HeaderPrefix starts every header the gateway reads or writes.
	HeaderPrefix = "X-Proxyfleet-"
)

// Parameter keys with a meaning of their own; every other key is an attribute selector.
const (
	keySession = "session"
	keySessTTL = "sessttl"
	keyProxy   = "proxy"
	keyRotate  = "rotate"
	keyPace    = "pace"
	keyStrict  = "strict"
)

// maxPace bounds a client's pace: a slower one is no crawl.
const maxPace = time.Hour

// maxUsernameLen bounds the username (and each parameter header) so a
// hostile client cannot make the parser do unbounded work per request.
const maxUsernameLen = 1024

// Params is what one request asked of the gateway, from its username and its
// X-Proxyfleet-* headers. The zero value means "defaults for everything".
type Params struct {
	// User is the client's name (the username before any parameter); "" when
	// the client sent no credentials.
	User string
	// Client is the token client whose token the request carried (its
	// --auth-token-file name), set by the admission stage, never parsed
	// from what the client sent; "" without token clients.
	Client string
	// Session names the sticky session; "" is the user's default session.
	Session string
	// SessTTL is how long the session keeps its member; 0 is the gateway's default.
	SessTTL time.Duration
	// Proxy pins the request to the member of that name; "" means any.
	Proxy string
	// Rotate is rotation.ModeSticky, rotation.ModeRequest, or "" for the
	// gateway's mode.
	Rotate rotation.Mode
	// Selector is attribute equality every chosen member must match; nil when empty.
	Selector map[string]string
	// Pace is the client's own least interval between two requests to a
	// site through one member; 0 is the operator's pace alone.
	Pace time.Duration
	// Strict keeps the session on its member: it is never moved to
	// another (session_lost instead). strictSet: the client said so
	// either way (strict-0 or strict-1), for Merge.
	Strict    bool
	strictSet bool
}

// SessionKey is the affinity key of the client's session: the token
// client, the user and the session name, so two users' sessions of the
// same name never share a member, and neither do two token clients whose
// crawlers chose the same user name (each may use other members).
func (p *Params) SessionKey() string {
	k := p.User
	if p.Session != "" {
		k += "\x00" + p.Session
	}
	if p.Client != "" {
		k = p.Client + "\x01" + k
	}
	return k
}

// Error is a malformed username, header or credential: the gateway answers
// 407 with its message, never a silent default. Msg quotes what the client
// sent safely (echo.Quote) and never holds a token.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

func paramErr(parts ...string) error { return &Error{Msg: strings.Join(parts, "")} }

// ParseUsername reads the parameters a username carries, in either form:
// `user-session-abc123-region-eu` (hyphen-separated key/value pairs after
// the user) or `user;session=abc123;zone=europe-west1-b` (for values with
// hyphens). The user name itself may contain neither '-' nor ';'.
func ParseUsername(username string) (Params, error) {
	var p Params
	if username == "" {
		return p, nil
	}
	if len(username) > maxUsernameLen {
		return p, paramErr("username longer than ", strconv.Itoa(maxUsernameLen), " bytes")
	}
	sep, semi := byte('-'), false
	if strings.IndexByte(username, ';') >= 0 {
		sep, semi = ';', true
	}
	i := strings.IndexByte(username, sep)
	if i < 0 {
		if err := checkUser(username); err != nil {
			return p, err
		}
		p.User = username
		return p, nil
	}
	p.User, username = username[:i], username[i+1:]
	if err := checkUser(p.User); err != nil {
		return p, err
	}
	if username == "" {
		return p, paramErr("username ends with ", echo.Quote(string(sep)))
	}
	if semi {
		for {
			seg, rest, more := strings.Cut(username, ";")
			if seg == "" {
				return p, paramErr("empty ;key=value pair in username")
			}
			k, v, ok := strings.Cut(seg, "=")
			if !ok {
				return p, paramErr("username parameter ", echo.Quote(seg), " is not key=value")
			}
			if err := p.set(k, v, true, "username"); err != nil {
				return p, err
			}
			if !more {
				return p, nil
			}
			username = rest
		}
	}
	// Hyphen form: the rest is key-value-key-value...
	for {
		k, rest, ok := strings.Cut(username, "-")
		if !ok {
			return p, paramErr("username parameter ", echo.Quote(k), " has no value (odd number of key-value parts)")
		}
		v, rest, more := strings.Cut(rest, "-")
		if err := p.set(k, v, false, "username"); err != nil {
			return p, err
		}
		if !more {
			return p, nil
		}
		if rest == "" {
			return p, paramErr("username ends with '-'")
		}
		username = rest
	}
}

// ParseHeaders reads the X-Proxyfleet-* request headers. Each may appear at
// most once, except X-Proxyfleet-Select whose lines join as one list.
func ParseHeaders(h http.Header) (Params, error) {
	var p Params
	for _, name := range [...]string{HeaderSession, HeaderProxy, HeaderRotate, HeaderSessTTL, HeaderPace, HeaderStrict} {
		vs := h[name]
		if len(vs) == 0 {
			continue
		}
		if len(vs) > 1 {
			return p, paramErr("header ", name, " given more than once")
		}
		if len(vs[0]) > maxUsernameLen {
			return p, paramErr("header ", name, " longer than ", strconv.Itoa(maxUsernameLen), " bytes")
		}
		v := strings.TrimSpace(vs[0])
		if v == "" {
			return p, paramErr("header ", name, " is empty")
		}
		var k string
		switch name {
		case HeaderSession:
			k = keySession
		case HeaderProxy:
			k = keyProxy
		case HeaderRotate:
			k = keyRotate
		case HeaderPace:
			k = keyPace
		case HeaderStrict:
			k = keyStrict
		default:
			k = keySessTTL
		}
		if err := p.set(k, v, true, name); err != nil {
			return p, err
		}
	}
	for _, line := range h[HeaderSelect] {
		if len(line) > maxUsernameLen {
			return p, paramErr("header ", HeaderSelect, " longer than ", strconv.Itoa(maxUsernameLen), " bytes")
		}
		for {
			var item string
			var more bool
			item, line, more = strings.Cut(line, ",")
			item = strings.TrimSpace(item)
			if item == "" {
				return p, paramErr("empty key=value item in ", HeaderSelect)
			}
			k, v, ok := strings.Cut(item, "=")
			if !ok {
				return p, paramErr(HeaderSelect, " item ", echo.Quote(item), " is not key=value")
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if isReserved(k) {
				return p, paramErr(echo.Quote(k), " is not an attribute; use the X-Proxyfleet-", headerSuffix(k), " header or the username parameter")
			}
			if err := p.set(k, v, true, HeaderSelect); err != nil {
				return p, err
			}
			if !more {
				break
			}
		}
	}
	return p, nil
}

// Merge combines username parameters u with header parameters h. A key set
// in both must have the same value: disagreeing is an error, not a precedence rule.
func Merge(u, h Params) (Params, error) {
	if h.isZero() { // the common case: no parameter header
		return u, nil
	}
	out := u
	pick := func(key, a, b string) (string, error) {
		if a != "" && b != "" && a != b {
			return "", paramErr(key, ": username says ", echo.Quote(a), " but header says ", echo.Quote(b))
		}
		if a == "" {
			return b, nil
		}
		return a, nil
	}
	var err error
	if out.Session, err = pick(keySession, u.Session, h.Session); err != nil {
		return u, err
	}
	if out.Proxy, err = pick(keyProxy, u.Proxy, h.Proxy); err != nil {
		return u, err
	}
	rot, err := pick(keyRotate, string(u.Rotate), string(h.Rotate))
	if err != nil {
		return u, err
	}
	out.Rotate = rotation.Mode(rot)
	if u.SessTTL != 0 && h.SessTTL != 0 && u.SessTTL != h.SessTTL {
		return u, paramErr("sessttl: username says ", u.SessTTL.String(), " but header says ", h.SessTTL.String())
	}
	if out.SessTTL == 0 {
		out.SessTTL = h.SessTTL
	}
	if u.Pace != 0 && h.Pace != 0 && u.Pace != h.Pace {
		return u, paramErr("pace: username says ", u.Pace.String(), " but header says ", h.Pace.String())
	}
	if out.Pace == 0 {
		out.Pace = h.Pace
	}
	if u.strictSet && h.strictSet && u.Strict != h.Strict {
		return u, paramErr("strict: username and header disagree")
	}
	if !out.strictSet {
		out.Strict, out.strictSet = h.Strict, h.strictSet
	}
	if len(h.Selector) > 0 {
		if len(u.Selector) == 0 {
			out.Selector = h.Selector
		} else {
			out.Selector = make(map[string]string, len(u.Selector)+len(h.Selector))
			for k, v := range u.Selector {
				out.Selector[k] = v
			}
			for k, v := range h.Selector {
				if old, ok := out.Selector[k]; ok && old != v {
					return u, paramErr(k, ": username says ", echo.Quote(old), " but header says ", echo.Quote(v))
				}
				out.Selector[k] = v
			}
		}
	}
	return out, nil
}

// isZero reports whether p asks for nothing: no parameter of a header
// (which carry no user) was given.
func (p *Params) isZero() bool {
	return p.Session == "" && p.Proxy == "" && p.Rotate == "" && p.SessTTL == 0 && p.Selector == nil && p.Pace == 0 && !p.strictSet
}

// checkParamChars refuses a key or value with a character parameters do
// not take (wide: the ;key=value form, whose values may hold '-').
func checkParamChars(k, v string, wide bool, where string) error {
	for i := 0; i < len(k); i++ {
		if !isKeyChar(k[i]) {
			return paramErr("key ", echo.Quote(k), " in ", where, " has a character outside [A-Za-z0-9_./]")
		}
	}
	for i := 0; i < len(v); i++ {
		if !isValueChar(v[i], wide) {
			if wide {
				return paramErr("value of ", echo.Quote(k), " in ", where, " has a character outside [A-Za-z0-9_.:/-]")
			}
			return paramErr("value of ", echo.Quote(k), " in ", where, " has a character outside [A-Za-z0-9_.:/] (use user;key=value for values with '-')")
		}
	}
	return nil
}

// set records one key/value; where names the source for the error text.
// wide allows '-' in values (the ;key=value form and headers).
func (p *Params) set(k, v string, wide bool, where string) error {
	if k == "" {
		return paramErr("empty key in ", where)
	}
	if v == "" {
		return paramErr("empty value for ", echo.Quote(k), " in ", where)
	}
	if err := checkParamChars(k, v, wide, where); err != nil {
		return err
	}
	dup := func() error { return paramErr("key ", echo.Quote(k), " given twice in ", where) }
	switch k {
	case keySession:
		if p.Session != "" {
			return dup()
		}
		p.Session = v
	case keyProxy:
		if p.Proxy != "" {
			return dup()
		}
		p.Proxy = v
	case keyRotate:
		if p.Rotate != "" {
			return dup()
		}
		m, err := rotation.ParseMode(v)
		if err != nil {
			return paramErr("rotate ", echo.Quote(v), " in ", where, ": want sticky or request")
		}
		p.Rotate = m
	case keySessTTL:
		if p.SessTTL != 0 {
			return dup()
		}
		d, err := parseSessTTL(v)
		if err != nil {
			return paramErr("sessttl ", echo.Quote(v), " in ", where, ": ", err.Error())
		}
		p.SessTTL = d
	case keyPace:
		if p.Pace != 0 {
			return dup()
		}
		d, err := parseSessTTL(v)
		if err == nil && d > maxPace {
			err = paramErr("longer than ", maxPace.String())
		}
		if err != nil {
			return paramErr("pace ", echo.Quote(v), " in ", where, ": ", err.Error())
		}
		p.Pace = d
	case keyStrict:
		if p.strictSet {
			return dup()
		}
		switch v {
		case "1", "true":
			p.Strict = true
		case "0", "false":
		default:
			return paramErr("strict ", echo.Quote(v), " in ", where, ": want 1 or 0")
		}
		p.strictSet = true
	default:
		if _, ok := p.Selector[k]; ok {
			return dup()
		}
		if p.Selector == nil {
			p.Selector = make(map[string]string, 2)
		}
		p.Selector[k] = v
	}
	return nil
}

// parseSessTTL accepts a Go duration ("90s", "5m") or integer seconds ("90").
func parseSessTTL(v string) (time.Duration, error) {
	allDigits := true
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			allDigits = false
			break
		}
	}
	if allDigits {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > math.MaxInt64/int64(time.Second) {
			return 0, paramErr("too long")
		}
		if n == 0 {
			return 0, paramErr("must be greater than zero")
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, paramErr("want a duration (90s, 5m) or integer seconds")
	}
	if d <= 0 {
		return 0, paramErr("must be greater than zero")
	}
	return d, nil
}

func checkUser(u string) error {
	if u == "" {
		return paramErr("empty user name before the parameters")
	}
	for i := 0; i < len(u); i++ {
		c := u[i]
		if !(isAlnum(c) || c == '_' || c == '.' || c == '@') {
			return paramErr("user name ", echo.Quote(u), " has a character outside [A-Za-z0-9_.@]")
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func isKeyChar(c byte) bool { return isAlnum(c) || c == '_' || c == '.' || c == '/' }

func isValueChar(c byte, wide bool) bool {
	return isAlnum(c) || c == '_' || c == '.' || c == ':' || c == '/' || (wide && c == '-')
}

// isReserved reports whether k is a parameter key with a meaning of its
// own, not an attribute selector. The list is the pool's
// (pool.ReservedAttributeKey), which refuses an attribute with such a key
// since no selector could name it; TestEveryParameterKeyIsReserved pins
// that the two agree.
func isReserved(k string) bool { return pool.ReservedAttributeKey(k) }

func headerSuffix(k string) string {
	switch k {
	case keySession:
		return "Session"
	case keySessTTL:
		return "Sessttl"
	case keyProxy:
		return "Proxy"
	case keyPace:
		return "Pace"
	case keyStrict:
		return "Strict"
	}
	return "Rotate"
}

// ParseProxyAuthorization splits `Basic base64(user:token)`. The token is
// returned for the constant-time check only; it must never be logged, and
// no error holds it.
func ParseProxyAuthorization(v string) (user, token string, err error) {
	scheme, rest, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", "", paramErr("Proxy-Authorization must be Basic base64(user:token)")
	}
	raw, derr := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
	if derr != nil {
		return "", "", paramErr("Proxy-Authorization is not valid base64")
	}
	user, token, ok = strings.Cut(string(raw), ":")
	if !ok {
		return "", "", paramErr("Proxy-Authorization credentials must be user:token")
	}
	return user, token, nil
}
