// Package clients reads a gateway's token clients (--auth-token-file): one
// line per client, its name, its token (the Proxy-Authorization password),
// what it may use and its quotas:
//
//	# NAME   TOKEN          WHAT IT MAY USE                  QUOTAS
//	team-a   8Yc1Zt...      pool=fleet/eu pool=fleet/us      leases=20 rps=50 site-rps=5
//	team-b   Hq93Lm...      select=region=eu,tier=dc
//	ops      c0FfEe...      all
//
// It is pure: it reads text and returns Clients, or an error naming the
// line and what is wrong with it, never the token. A line that is a token
// alone (the format before clients had names) is an error: an operator
// upgrading names each client and says what it may use (docs/tenancy.md).
package clients

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/quota"
)

// Client is one line of the file.
type Client struct {
	// Name names the client in refusals, logs and (later) metrics: a DNS
	// label, so it is a bounded, printable label value.
	Name string
	// Token is its Proxy-Authorization password. Never logged or echoed.
	Token string
	// Line is where the client was written, for messages.
	Line int
	// All: the client may use every member (the keyword all).
	All bool
	// Scopes are the parts of the fleet it may use otherwise, in the order
	// written (the order it leases in): each the members whose attributes
	// carry every pair of the selector.
	Scopes []Scope
	// Quota is what it may take at once, per second and per day (leases=,
	// rps=, site-rps=, bytes-per-day=); zero: no limit.
	Quota quota.Limits
	// Tiers are the tiers of egress it may use (tiers=NAME,NAME: a run of
	// the gateway's --tiers, checked against them at start by
	// tiering.Options.Range); nil: every tier.
	Tiers []string
}

// Scope is one part of the fleet a client may use.
type Scope struct {
	// Name says it in a refusal: "pool fleet/eu", "members with region=eu".
	Name string
	// Selector is the attributes its members carry.
	Selector map[string]string
}

// Selectors are c's scopes' selectors, for pool.AcquireWithin; nil for a
// client that may use every member.
func (c *Client) Selectors() []map[string]string {
	if c.All {
		return nil
	}
	out := make([]map[string]string, len(c.Scopes))
	for i, s := range c.Scopes {
		out[i] = s.Selector
	}
	return out
}

// Covers reports whether c may use a member with attrs.
func (c *Client) Covers(attrs map[string]string) bool {
	if c.All {
		return true
	}
	for _, s := range c.Scopes {
		if hasAll(attrs, s.Selector) {
			return true
		}
	}
	return false
}

func hasAll(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// maxLine bounds one line; a longer one is an error, not a truncation.
const maxLine = 64 << 10

// namePattern is a DNS label (RFC 1123), as Kubernetes names namespaces:
// a client's name is printed in messages and will label metrics.
var namePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// poolPattern is a ProxyPool's name (a DNS subdomain); keyPattern a
// field key a message may echo.
var (
	poolPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
	keyPattern  = regexp.MustCompile(`^[a-z][a-z-]{0,30}$`)
)

// Keys of a line's fields after the token.
const (
	keyPool        = "pool"
	keySelect      = "select"
	keyTiers       = "tiers"
	keyLeases      = "leases"
	keyRPS         = "rps"
	keySiteRPS     = "site-rps"
	keyBytesPerDay = "bytes-per-day"
	wordAll        = "all"
)

// Parse reads a token-clients file: blank lines and lines starting with #
// are skipped; every other line is NAME TOKEN FIELD..., separated by
// blanks, where a field is all, pool=NAMESPACE/POOL or select=K=V[,K=V].
// Names and tokens are each used once. A file without a client is an
// error: an empty list would mean no authentication.
func Parse(r io.Reader) ([]Client, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	var out []Client
	names := map[string]int{}
	tokens := map[string]int{}
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		c, err := parseLine(n, strings.Fields(line))
		if err != nil {
			return nil, err
		}
		if first, dup := names[c.Name]; dup {
			return nil, fmt.Errorf("line %d: client %s is already on line %d: one line per client", n, c.Name, first)
		}
		if first, dup := tokens[c.Token]; dup {
			return nil, fmt.Errorf("line %d (client %s): its token is already on line %d: every client needs a token of its own", n, c.Name, first)
		}
		names[c.Name], tokens[c.Token] = n, n
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("a line is longer than %d bytes", maxLine)
		}
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("holds no client (want NAME TOKEN all|pool=NS/POOL|select=K=V per line; # starts a comment)")
	}
	return out, nil
}

// parseLine reads the fields of line n. Its messages quote a name only
// once it reads as one, and never the token: a line of the old format is
// the token alone.
func parseLine(n int, f []string) (Client, error) {
	if len(f) == 1 {
		return Client{}, fmt.Errorf("line %d: a token without a client name (the format before token clients): write NAME TOKEN all to keep what it may use (docs/tenancy.md#token-clients)", n)
	}
	if !namePattern.MatchString(f[0]) {
		return Client{}, fmt.Errorf("line %d: the first word is not a client name (a DNS label: lower-case letters, digits and '-', at most 63); want NAME TOKEN all|pool=NS/POOL|select=K=V", n)
	}
	c := Client{Name: f[0], Token: f[1], Line: n}
	for i, field := range f[2:] {
		if err := c.set(i+3, field); err != nil {
			return Client{}, fmt.Errorf("line %d (client %s): %w", n, c.Name, err)
		}
	}
	if !c.All && len(c.Scopes) == 0 {
		return Client{}, fmt.Errorf("line %d (client %s): says nothing of what it may use: add all, pool=NAMESPACE/POOL or select=K=V[,K=V]", n, c.Name)
	}
	if c.All && len(c.Scopes) > 0 {
		return Client{}, fmt.Errorf("line %d (client %s): all with pool= or select=: all already means every member", n, c.Name)
	}
	return c, nil
}

// set reads field i of the line (after the token). Its messages echo a
// field's key only when it reads as one: a token written in the wrong
// place must not reach a log.
func (c *Client) set(i int, field string) error {
	if field == wordAll {
		c.All = true
		return nil
	}
	k, v, ok := strings.Cut(field, "=")
	if !ok {
		return fmt.Errorf("field %d is not all or key=value", i)
	}
	switch k {
	case keyPool:
		ns, p, ok := strings.Cut(v, "/")
		if !ok || !namePattern.MatchString(ns) || !poolPattern.MatchString(p) {
			return fmt.Errorf("pool=%s: want pool=NAMESPACE/POOL (a ProxyPool of that namespace)", v)
		}
		return c.add(Scope{Name: "pool " + ns + "/" + p, Selector: map[string]string{pool.AttributeNamespace: ns, pool.AttributePool: p}})
	case keySelect:
		sel, err := pool.ParseSelector(v)
		if err != nil {
			return fmt.Errorf("select=: %w", err)
		}
		if len(sel) == 0 {
			return errors.New("select= is empty: write all for every member")
		}
		return c.add(Scope{Name: "members with " + selectorString(sel), Selector: sel})
	case keyTiers:
		if c.Tiers != nil {
			return errors.New("tiers= is given twice: write the tiers once, comma-separated")
		}
		for _, n := range strings.Split(v, ",") {
			if n == "" || slices.Contains(c.Tiers, n) {
				return fmt.Errorf("tiers=%s: want tier names, each once, comma-separated (a run of the gateway's --tiers)", v)
			}
			c.Tiers = append(c.Tiers, n)
		}
		return nil
	case keyLeases:
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("leases=%s: want a whole number of leases (0: no limit)", v)
		}
		c.Quota.Leases = n
		return c.Quota.Check()
	case keyRPS, keySiteRPS:
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsInf(r, 0) {
			return fmt.Errorf("%s=%s: want requests per second, such as 20 or 0.5 (0: no limit)", k, v)
		}
		if k == keyRPS {
			c.Quota.RPS = r
		} else {
			c.Quota.SiteRPS = r
		}
		return c.Quota.Check()
	case keyBytesPerDay:
		n, err := parseBytes(v)
		if err != nil {
			return fmt.Errorf("bytes-per-day=%s: %w", v, err)
		}
		c.Quota.BytesPerDay = n
		return c.Quota.Check()
	}
	if keyPattern.MatchString(k) {
		return fmt.Errorf("unknown field %s= (want all, pool=, select=, leases=, rps=, site-rps=, bytes-per-day=)", k)
	}
	return fmt.Errorf("field %d: unknown key (want all, pool=, select=, leases=, rps=, site-rps=, bytes-per-day=)", i)
}

// parseBytes reads a byte count: a whole number, optionally with a
// decimal suffix K, M, G or T (10G is ten billion bytes, as bandwidth is
// billed).
func parseBytes(v string) (int64, error) {
	mult := int64(1)
	if v != "" {
		if i := strings.IndexByte("KMGT", v[len(v)-1]); i >= 0 {
			mult = int64(math.Pow(1000, float64(i+1)))
			v = v[:len(v)-1]
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || (n > 0 && n > math.MaxInt64/mult) {
		return 0, errors.New("want a whole number of bytes, optionally with K, M, G or T (0: no limit)")
	}
	return n * mult, nil
}

// add appends s unless the client has it already.
func (c *Client) add(s Scope) error {
	if slices.ContainsFunc(c.Scopes, func(o Scope) bool { return o.Name == s.Name }) {
		return fmt.Errorf("%s is given twice", s.Name)
	}
	c.Scopes = append(c.Scopes, s)
	return nil
}

// selectorString is sel as k=v,k=v, sorted.
func selectorString(sel map[string]string) string {
	pairs := make([]string, 0, len(sel))
	for k, v := range sel {
		pairs = append(pairs, k+"="+v)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

// Allowance is what c may use as its line says it: "all", or its scopes'
// fields (pool=fleet/eu select=region=eu).
func (c *Client) Allowance() string {
	if c.All {
		return wordAll
	}
	out := ""
	for i, s := range c.Scopes {
		if i > 0 {
			out += " "
		}
		if ns, p := s.Selector[pool.AttributeNamespace], s.Selector[pool.AttributePool]; len(s.Selector) == 2 && ns != "" && p != "" && s.Name == "pool "+ns+"/"+p {
			out += keyPool + "=" + ns + "/" + p
		} else {
			out += keySelect + "=" + selectorString(s.Selector)
		}
	}
	return out
}
