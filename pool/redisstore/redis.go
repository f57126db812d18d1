// Package redisstore is the shared lease store: pool.LeaseStore (and the
// site pacer) on Redis, each decision one Lua script that runs atomically on
// the server and reads the server's clock, so every gateway and controller
// replica on one Redis agrees on leases, cooldowns and pace. It speaks to a
// single server, Sentinel or Cluster (the URL's scheme), with TLS, and
// shards a fleet's keys across a Cluster's primaries by hash tag.
//
// It imports pool, rotation and internal/redact; only pool/leasestore
// imports it, so the sidecar build never links the Redis client.
package redisstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// redisReassertEvery is how often a RedisStore that owns a member list
// writes it again: it refreshes the member keys' TTLs, and it restores the
// members after Redis lost them (a FLUSHALL, a failover to a replica that
// was behind). A failed write is retried at every sweep instead.
const redisReassertEvery = time.Minute

// RedisOptions configures NewRedisStore.
type RedisOptions struct {
	// URL is redis://[user:password@]host:port[/db], rediss://... (TLS),
	// redis+sentinel://[user:password@]host:port[,host:port...]/master[/db]
	// (rediss+sentinel for TLS) or redis+cluster://[user:password@]host:port[,host:port...]
	// (rediss+cluster); see ParseRedisURL.
	URL string
	// Password, when set, overrides the URL's (from a password file, so
	// that the URL in a flag or environment holds no secret).
	Password string
	// Prefix namespaces the keys (several fleets, one Redis); default
	// DefaultRedisPrefix. It is the Cluster hash tag: {prefix}.
	Prefix string
	// Store holds the TTLs, cooldowns and cap, as for NewStore. Its Clock is
	// not used: the scripts read the Redis server's clock, which every
	// replica shares. ReleasedRetained bounds the released leases kept
	// reportable per member group, as in the memory store (the most
	// recent ones; every lease also ends its report window Cooldown.Max
	// after it ends).
	Store pool.StoreOptions
	// Logger receives store failures; nil discards.
	Logger *slog.Logger
	// CAFile is a PEM file of the CAs that sign the server's certificate
	// (rediss:// only; default: the system roots). CertFile and KeyFile
	// are a client certificate for servers that ask for one.
	CAFile, CertFile, KeyFile string
	// FailoverWait is how long a call retries while the store is
	// unavailable, riding out a Sentinel or Cluster failover; default
	// DefaultFailoverWait on redis+sentinel:// and redis+cluster://, none
	// on a single server (nothing takes its place). Negative turns it off.
	FailoverWait time.Duration
	// Observe, when set, is told every store operation's time and outcome
	// (retries included): the store round-trip metric.
	Observe func(op string, d time.Duration, err error)
	// Shards splits the members into this many groups, each a complete
	// store of its own under a hash tag of its own, so that on a Redis
	// Cluster the fleet's leases, cooldowns and choices divide across its
	// primaries. Group i's tag is {prefix:s<i>:<k>}, k the least number
	// that puts it in the middle of the i-th of Shards equal slot ranges:
	// on a Cluster whose primaries hold equal ranges (what redis-cli
	// --cluster create makes) every primary then holds as many groups as
	// the others. A member's group is a hash of its name; a lease names its
	// group. 0 or 1 is one group (every key under {prefix}, as before
	// groups). Every store of a prefix must use the same count; changing
	// it moves members between groups, which forgets their cooldowns, like
	// a new prefix.
	//
	// Each acquire is still one script on one group, so it costs what it
	// does unsharded: the first group tried is taken in turn (or by the
	// idempotency key, so that a retry finds its lease), the next ones
	// only when it has no eligible member. Within a group the choice is
	// rotation.Less; across groups the least-loaded member is chosen per
	// group, not fleet-wide. A refusal's counts are the sum of every
	// group's.
	Shards int
}

// RedisStore is the lease store on a Redis-protocol server: the same
// contract as Store (selection by rotation.Less among eligible members,
// {member, target} cooldowns with backoff, member-wide failure windows,
// exact 409 counts, late reports), with every operation one atomic Lua
// script on the server's clock. Any number of controller replicas and
// gateways may share one RedisStore's keys; see redis_lua.go for the
// layout and docs/architecture.md for the why.
type RedisStore struct {
	o      pool.StoreOptions
	rdb    redis.UniversalClient
	keys   []string   // {KEYS[1]}: "{prefix}:", the first group's
	shards [][]string // every group's KEYS; shards[0] is keys
	next   atomic.Uint64
	prefix string
	life   time.Duration
	log    *slog.Logger
	topo   *topology

	defs sync.Map // member def JSON -> pool.Member, so leases share parsed URLs

	later laterReleases // ReleaseLater's leases not yet sent

	mu         sync.Mutex
	want       []pool.MemberHealth // the member list this store owns, if any
	wantHealth bool
	haveWant   bool
	dirty      bool // the last member write failed
	lastWrite  time.Time
}

var redisScripts = struct {
	acquire, release, report, setMembers, setHealth, members, answered *redis.Script
}{
	redis.NewScript(redisAcquireLua),
	redis.NewScript(redisReleaseLua),
	redis.NewScript(redisReportLua),
	redis.NewScript(redisSetMembersLua),
	redis.NewScript(redisSetHealthLua),
	redis.NewScript(redisMembersLua),
	redis.NewScript(redisAnsweredLua),
}

// NewRedisStore connects (lazily: a Redis that is down now makes calls fail
// with ErrStoreUnavailable until it answers) to the server o.URL names.
// A malformed URL is an error that never shows the password.
func NewRedisStore(o RedisOptions) (*RedisStore, error) {
	uo, err := ParseRedisURL(o.URL)
	if err != nil {
		return nil, err
	}
	if o.Password != "" {
		uo.Password = o.Password
	}
	if err := applyTLSFiles(uo, o.CAFile, o.CertFile, o.KeyFile); err != nil {
		return nil, err
	}
	prefix := o.Prefix
	if prefix == "" {
		prefix = pool.DefaultRedisPrefix
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("lease store prefix %q must not contain { or }: it becomes the Cluster hash tag", prefix)
	}
	// A script whose reply was lost may be retried by the client: acquire
	// finds its own lease by id, release and report are idempotent.
	uo.MaxRetries = 2
	// One dial per attempt: the store's own retry (the failover wait) is
	// the one that waits, so an unreachable topology is an error in about
	// a second, not after go-redis' five dials per address per retry.
	uo.DialerRetries = 1
	if o.Shards < 0 || o.Shards > pool.MaxRedisShards {
		return nil, fmt.Errorf("lease store shards %d: want 1 to %d", o.Shards, pool.MaxRedisShards)
	}
	so := o.Store.WithDefaults()
	s := &RedisStore{
		o:      so,
		rdb:    redis.NewUniversalClient(uo),
		keys:   []string{"{" + prefix + "}:"},
		prefix: prefix,
		life:   max(24*time.Hour, 2*(so.MaxTTL+so.Cooldown.Max)),
		log:    o.Logger,
		topo:   newTopology(uo, o),
	}
	s.later.init(defaultLaterDelay, defaultMaxLater)
	s.shards = [][]string{s.keys}
	if o.Shards > 1 {
		s.shards = s.shards[:0]
		for i := range o.Shards {
			s.shards = append(s.shards, []string{"{" + shardTag(prefix, i, o.Shards) + "}:"})
		}
		s.keys = s.shards[0]
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	setClientLog.Do(func() { redis.SetLogger(clientLog{s.log}) })
	return s, nil
}

// ParseRedisURL reads the lease store URL forms into go-redis options:
//
//	redis://[user:password@]host:port[/db]
//	rediss://...                                   TLS
//	redis+sentinel://[user:password@]host:port[,host:port...]/master[/db]
//	redis+cluster://[user:password@]host:port[,host:port...]
//
// (rediss+sentinel, rediss+cluster for TLS). The credentials are the data
// nodes' (ACL user or requirepass); Sentinels are asked without AUTH. Errors
// show the URL with its password masked.
func ParseRedisURL(raw string) (*redis.UniversalOptions, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("lease store URL %q: want redis://, rediss://, redis+sentinel:// or redis+cluster://", redact.URL(raw))
	}
	tlsOn := strings.HasPrefix(scheme, "rediss")
	kind := ""
	switch scheme {
	case "redis", "rediss":
	case "redis+sentinel", "rediss+sentinel":
		kind = "sentinel"
	case "redis+cluster", "rediss+cluster":
		kind = "cluster"
	default:
		return nil, fmt.Errorf("lease store URL %q: unknown scheme %q; want redis, rediss, redis+sentinel or redis+cluster", redact.URL(raw), scheme)
	}
	hostPart, path, _ := strings.Cut(rest, "/")
	if strings.Contains(path, "@") {
		// A password holding '/': the address errors below would quote it.
		return nil, fmt.Errorf("lease store URL %q: '@' after the first '/'; percent-encode a '/' in the password as %%2F", redact.URL(raw))
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("lease store URL %q: no query or fragment allowed", redact.URL(raw))
	}
	o := &redis.UniversalOptions{}
	if at := strings.LastIndex(hostPart, "@"); at >= 0 {
		u, err := url.Parse("redis://" + hostPart[:at] + "@x")
		if err != nil || u.User == nil {
			return nil, fmt.Errorf("lease store URL %q: malformed user:password", redact.URL(raw))
		}
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
		hostPart = hostPart[at+1:]
	}
	for h := range strings.SplitSeq(hostPart, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" {
			return nil, fmt.Errorf("lease store URL %q: address %q: want host:port", redact.URL(raw), h)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("lease store URL %q: port %q out of range", redact.URL(raw), port)
		}
		o.Addrs = append(o.Addrs, h)
	}
	segs := []string{}
	if path != "" {
		segs = strings.Split(path, "/")
	}
	db := func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return fmt.Errorf("lease store URL %q: database %q is not a number >= 0", redact.URL(raw), s)
		}
		o.DB = n
		return nil
	}
	switch kind {
	case "":
		if len(o.Addrs) != 1 {
			return nil, fmt.Errorf("lease store URL %q: %s:// takes one host:port; use redis+sentinel:// or redis+cluster:// for several", redact.URL(raw), scheme)
		}
		if len(segs) > 1 {
			return nil, fmt.Errorf("lease store URL %q: path must be /<db>", redact.URL(raw))
		}
		if len(segs) == 1 && segs[0] != "" {
			if err := db(segs[0]); err != nil {
				return nil, err
			}
		}
	case "sentinel":
		if len(segs) == 0 || segs[0] == "" || len(segs) > 2 {
			return nil, fmt.Errorf("lease store URL %q: want /<master-name>[/<db>] after the Sentinel addresses", redact.URL(raw))
		}
		o.MasterName = segs[0]
		if len(segs) == 2 {
			if err := db(segs[1]); err != nil {
				return nil, err
			}
		}
	case "cluster":
		if len(segs) > 1 || (len(segs) == 1 && segs[0] != "" && segs[0] != "0") {
			return nil, fmt.Errorf("lease store URL %q: Redis Cluster has only database 0", redact.URL(raw))
		}
		o.IsClusterMode = true
	}
	if tlsOn {
		host, _, _ := net.SplitHostPort(o.Addrs[0])
		o.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	return o, nil
}

// Close sends the deferred releases still waiting (for up to
// closeFlushWait: a Redis that is down does not hold a shutdown up) and
// closes the connections to Redis.
func (s *RedisStore) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), closeFlushWait)
	s.flushLater(ctx)
	cancel()
	s.later.stop()
	return s.rdb.Close()
}

// MaxTTL is the longest lease Acquire grants.
func (s *RedisStore) MaxTTL() time.Duration { return s.o.MaxTTL }

// Ping checks that the store answers for this fleet (a start-up log line,
// /readyz): a read of one of its keys, so on a Cluster the node serving its
// slot answers (a PING would be answered by any node, even with that slot
// uncovered) and on Sentinel the primary does. Errors say what failed: no
// Sentinel answered, the slot is not served, the TLS handshake (ErrTLS).
func (s *RedisStore) Ping(ctx context.Context) error {
	err := s.do(ctx, "ping", func(ctx context.Context) error {
		for _, keys := range s.shards {
			if err := s.rdb.Exists(ctx, keys[0]+"members").Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.wrap("ping", err)
	}
	return nil
}

func (s *RedisStore) args(extra ...any) []any {
	return append([]any{s.life.Milliseconds(), s.o.Cooldown.Max.Milliseconds()}, extra...)
}

// wrap classifies a go-redis error: a reply error of a script is a bug
// (internal), anything else — connection refused, timeouts, LOADING,
// failover replies — is ErrStoreUnavailable.
func (s *RedisStore) wrap(op string, err error) error {
	if e := tlsError(err); e != nil {
		return fmt.Errorf("lease store: %s: %w", op, e)
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, transient := range []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOAUTH", "WRONGPASS", "BUSY"} {
			if strings.HasPrefix(msg, transient) {
				return fmt.Errorf("%w: %s: %s", pool.ErrStoreUnavailable, op, msg)
			}
		}
		return fmt.Errorf("lease store: %s: %w", op, err)
	}
	return fmt.Errorf("%w: %s: %w", pool.ErrStoreUnavailable, op, err)
}

// Acquire is Store.Acquire as one script: the eligible member first by
// rotation.Less is chosen and leased atomically, on the server's clock. A
// request with an IdempotencyKey that already took a lease gets that lease
// again, so a gateway retrying on another replica never holds two.
func (s *RedisStore) Acquire(ctx context.Context, req pool.AcquireRequest) (pool.Lease, error) {
	ttl := req.TTL
	switch {
	case ttl < 0:
		return pool.Lease{}, fmt.Errorf("%w: %s must not be negative", pool.ErrInvalidTTL, ttl)
	case ttl == 0:
		ttl = s.o.DefaultTTL
	case ttl > s.o.MaxTTL:
		return pool.Lease{}, fmt.Errorf("%w: %s > %s", pool.ErrTTLTooLong, ttl, s.o.MaxTTL)
	}
	// The groups to try, in order: a pinned member's own; else one in turn
	// (by the idempotency key when there is one, so that a retry on another
	// replica tries the groups in the same order and finds its lease), the
	// others after it only when it has nobody eligible.
	n, start := len(s.shards), 0
	switch {
	case req.Proxy != "":
		n, start = 1, s.shardOf(req.Proxy)
	case n > 1 && req.IdempotencyKey != "":
		start = int(fnv32(req.IdempotencyKey) % uint32(n))
	case n > 1:
		start = int(s.next.Add(1) % uint64(n))
	}
	var refused pool.NoMatchError
	for i := range n {
		g := (start + i) % len(s.shards)
		l, err := s.acquireIn(ctx, g, req, ttl)
		var nm *pool.NoMatchError
		if !errors.As(err, &nm) {
			return l, err
		}
		refused.Add(nm) // the first member back in any group is the fleet's first back
	}
	refused.SetRetryAfter(time.Duration(refused.RetryAfterSeconds) * time.Second)
	return pool.Lease{}, &refused
}

// acquireIn is one acquire script on group g.
func (s *RedisStore) acquireIn(ctx context.Context, g int, req pool.AcquireRequest, ttl time.Duration) (pool.Lease, error) {
	id := rand.Text()
	if g > 0 {
		id = "s" + strconv.Itoa(g) + "-" + id
	}
	// The group's deferred releases ride along and are applied first, so
	// this acquire sees them; a failed call gives them back.
	carried := s.later.take(g, maxCarried)
	argv := s.args(id, max(ttl.Milliseconds(), 1), req.Target, req.Proxy, req.IdempotencyKey, s.o.MaxLeasesPerMember, s.o.ReleasedRetained, len(carried))
	for _, r := range carried {
		argv = append(argv, r)
	}
	if len(req.Selector) > 0 {
		for _, k := range slices.Sorted(maps.Keys(req.Selector)) {
			argv = append(argv, k, req.Selector[k])
		}
	}
	// On Sentinel and Cluster the lease waits for a replica (WAIT) too: a
	// lease the new primary did not know after a failover would refuse the
	// ban its holder reports on it.
	res, err := s.runAckedIn(ctx, "acquire", s.shards[g], true, redisScripts.acquire, argv...).Slice()
	if err != nil {
		s.later.giveBack(g, carried)
		return pool.Lease{}, s.wrap("acquire", err)
	}
	if len(res) == 0 {
		return pool.Lease{}, errors.New("lease store: acquire: empty reply")
	}
	switch res[0] {
	case "nomatch":
		if len(res) != 6 {
			return pool.Lease{}, fmt.Errorf("lease store: acquire: malformed refusal %v", res)
		}
		nm := &pool.NoMatchError{
			Considered: toInt(res[1]), AtCapacity: toInt(res[2]), InCooldown: toInt(res[3]), Unhealthy: toInt(res[4]),
		}
		nm.SetRetryAfter(time.Duration(toInt(res[5])) * time.Millisecond)
		return pool.Lease{}, nm
	case "ok", "dup":
		// A retry's answer ("dup") has no override flag.
		if len(res) != 7 && len(res) != 8 {
			return pool.Lease{}, fmt.Errorf("lease store: acquire: malformed lease %v", res)
		}
		m, err := s.member(toString(res[2]), toString(res[3]))
		if err != nil {
			return pool.Lease{}, err
		}
		return pool.Lease{
			ID:          toString(res[1]),
			Member:      m,
			Target:      toString(res[4]),
			TTL:         time.Duration(toInt(res[5])) * time.Millisecond,
			ExpiresAt:   time.UnixMilli(int64(toInt(res[6]))),
			FailureRest: len(res) == 8 && toString(res[7]) == "1",
		}, nil
	}
	return pool.Lease{}, fmt.Errorf("lease store: acquire: unexpected reply %v", res[0])
}

// Release is Store.Release: idempotent, and a lease counts down exactly
// once (the expiry index holds it until it ends by time or by release).
// It returns once Redis applied it; the group's deferred releases (see
// ReleaseLater) go with it.
func (s *RedisStore) Release(ctx context.Context, leaseID string) error {
	g := s.leaseShard(leaseID)
	ids := append(s.later.take(g, maxCarried), leaseID)
	if err := s.releaseIn(ctx, g, ids); err != nil {
		s.later.giveBack(g, ids[:len(ids)-1])
		return err
	}
	return nil
}

// releaseIn is one release script on group g ending every lease in ids.
func (s *RedisStore) releaseIn(ctx context.Context, g int, ids []string) error {
	argv := s.args(s.o.ReleasedRetained)
	for _, id := range ids {
		argv = append(argv, id)
	}
	if err := s.runIn(ctx, "release", s.shards[g], redisScripts.release, argv...).Err(); err != nil {
		return s.wrap("release", err)
	}
	return nil
}

// Report is Store.Report. The backoff windows come from
// rotation.CooldownPolicy.Window, computed here for every strike count up
// to the cap, so the policy has one definition. A report on a lease whose
// member was removed or became a new upstream under its name changes
// nothing (fencing: it cannot cool the new upstream down).
func (s *RedisStore) Report(ctx context.Context, leaseID string, r pool.Report) error {
	if _, err := rotation.ParseResult(string(r.Result)); err != nil {
		return fmt.Errorf("%w: %v", pool.ErrInvalidResult, err)
	}
	argv := s.args(leaseID, string(r.Result), r.Target, s.o.FailureWindow.Milliseconds(), s.o.SiteFailureRest.Milliseconds(), s.failurePercent())
	argv = append(argv, s.banWindows(max(r.RetryAfter, 0))...)
	// A ban or a cooldown waits for a replica's acknowledgement (WAIT) on
	// Sentinel and Cluster, so a failover right after cannot lose it; an ok
	// report only resets backoff and does not wait.
	res, err := s.runAckedIn(ctx, "report", s.shards[s.leaseShard(leaseID)], r.Result != rotation.ResultOK, redisScripts.report, argv...).Text()
	if err != nil {
		return s.wrap("report", err)
	}
	if res == "unknown" {
		return fmt.Errorf("%w %q", pool.ErrUnknownLease, leaseID)
	}
	return nil
}

// failurePercent is rotation.FailureRest.MaxPercent with its default,
// for the report script.
func (s *RedisStore) failurePercent() int {
	p := s.o.FailureRest.MaxPercent
	switch {
	case p <= 0:
		return rotation.DefaultMaxFailureRestPercent
	case p > 100:
		return 100
	}
	return p
}

// banWindows lists Cooldown.Window(retryAfter, n) in ms for n = 1, 2, ...
// until the window stops growing (the cap); the script repeats the last.
func (s *RedisStore) banWindows(retryAfter time.Duration) []any {
	var out []any
	prev := time.Duration(-1)
	for n := 1; n <= 64; n++ {
		w := s.o.Cooldown.Window(retryAfter, n)
		if w == prev {
			break
		}
		out = append(out, max(w.Milliseconds(), 1))
		prev = w
	}
	return out
}

// memberDef is a member as the store keeps it in Redis.
type memberDef struct {
	URL  string            `json:"u,omitempty"`
	Src  string            `json:"s,omitempty"`
	Attr map[string]string `json:"a,omitempty"`
}

// member decodes a member def, sharing the result across leases.
func (s *RedisStore) member(name, def string) (pool.Member, error) {
	key := name + "\x00" + def
	if m, ok := s.defs.Load(key); ok {
		return m.(pool.Member), nil
	}
	var d memberDef
	if err := json.Unmarshal([]byte(def), &d); err != nil {
		return pool.Member{}, fmt.Errorf("lease store: member %q: %w", name, err)
	}
	m := pool.Member{Name: name, Attributes: d.Attr}
	if d.URL != "" {
		u, err := url.Parse(d.URL)
		if err != nil {
			return pool.Member{}, fmt.Errorf("lease store: member %q: bad URL", name)
		}
		m.URL = u
	}
	if d.Src != "" {
		a, err := netip.ParseAddr(d.Src)
		if err != nil {
			return pool.Member{}, fmt.Errorf("lease store: member %q: %w", name, err)
		}
		m.SourceAddr = a
	}
	s.defs.Store(key, m)
	return m, nil
}

// memberWire is one member in the setMembers script's JSON.
type memberWire struct {
	Name string   `json:"n"`
	Def  string   `json:"d"`
	FP   string   `json:"f"`
	AJ   string   `json:"aj"`
	A    []string `json:"a"`
	H    string   `json:"h"`
	Lat  int64    `json:"l"`
}

func encodeMember(m pool.MemberHealth) memberWire {
	d := memberDef{Attr: m.Attributes}
	if m.URL != nil {
		d.URL = m.URL.String()
	}
	if m.SourceAddr.IsValid() {
		d.Src = m.SourceAddr.String()
	}
	def, _ := json.Marshal(d)
	// The fingerprint is what SameEndpoint compares, hashed so that the
	// credentials are not stored twice.
	fp := m.SourceAddr.String() + "\x00"
	if u := m.URL; u != nil {
		pass, _ := u.User.Password()
		fp += u.Scheme + "\x00" + u.Host + "\x00" + strconv.FormatBool(u.User != nil) + "\x00" + u.User.Username() + "\x00" + pass
	}
	sum := sha256.Sum256([]byte(fp))
	attrs := m.Attributes
	if attrs == nil {
		attrs = map[string]string{}
	}
	aj, _ := json.Marshal(attrs) // sorted keys: equal maps, equal strings
	flat := make([]string, 0, 2*len(attrs))
	for _, k := range slices.Sorted(maps.Keys(attrs)) {
		flat = append(flat, k, attrs[k])
	}
	h := "0"
	if m.Healthy {
		h = "1"
	}
	return memberWire{Name: m.Name, Def: string(def), FP: hex.EncodeToString(sum[:]), AJ: string(aj), A: flat, H: h, Lat: max(m.Latency.Nanoseconds(), 0)}
}

// SetMembers is Store.SetMembers. The store remembers the list and writes
// it again every minute (refreshing the keys' TTLs, restoring members that
// Redis lost) and after a failed write, so a Redis outage heals by itself.
// Several writers of one prefix must agree on the members: the last write
// wins (controller replicas read the same Proxies; standalone gateways
// sharing a store should share their upstreams file).
func (s *RedisStore) SetMembers(members []pool.Member) {
	mh := make([]pool.MemberHealth, len(members))
	for i, m := range members {
		mh[i] = pool.MemberHealth{Member: m, Healthy: true}
	}
	s.setMembers(mh, false)
}

// SetMembersHealth is Store.SetMembersHealth: membership and health in one
// script, so no new unhealthy member is leased in between.
func (s *RedisStore) SetMembersHealth(members []pool.MemberHealth) {
	s.setMembers(slices.Clone(members), true)
}

func (s *RedisStore) setMembers(members []pool.MemberHealth, withHealth bool) {
	s.mu.Lock()
	s.want, s.wantHealth, s.haveWant = members, withHealth, true
	s.mu.Unlock()
	s.writeMembers(context.Background())
}

// writeMembers writes the remembered member list; it logs a failure and
// marks it for the next sweep.
func (s *RedisStore) writeMembers(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.haveWant {
		return
	}
	wire := make([][]memberWire, len(s.shards))
	for g := range wire {
		wire[g] = []memberWire{} // a group with no member is written too: it drops its old ones
	}
	for _, m := range s.want {
		g := s.shardOf(m.Name)
		w := encodeMember(m)
		wire[g] = append(wire[g], w)
		// The members' parsed definitions, as their leases will carry
		// them: a store that owns the list never parses one on an acquire.
		_, _ = s.member(w.Name, w.Def)
	}
	hflag := "0"
	if s.wantHealth {
		hflag = "1"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var err error
	for g, ws := range wire {
		buf, _ := json.Marshal(ws)
		if err = s.runIn(ctx, "set_members", s.shards[g], redisScripts.setMembers, s.args(hflag, string(buf))...).Err(); err != nil {
			break
		}
	}
	if err != nil {
		if !s.dirty {
			s.log.Error("lease store: writing the members failed; retrying at every sweep", "error", s.wrap("set members", err))
		}
		s.dirty = true
		return
	}
	if s.dirty {
		s.log.Info("lease store: members written again", "members", len(s.want))
	}
	s.dirty, s.lastWrite = false, time.Now()
}

// SetHealth is Store.SetHealth; unknown names are ignored. The verdict is
// also remembered, so a re-written member list carries it.
func (s *RedisStore) SetHealth(name string, healthy bool, latency time.Duration) {
	s.mu.Lock()
	for i := range s.want {
		if s.want[i].Name == name {
			s.want[i].Healthy, s.want[i].Latency = healthy, latency
			s.wantHealth = true
		}
	}
	s.mu.Unlock()
	h := "0"
	if healthy {
		h = "1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.runIn(ctx, "set_health", s.shards[s.shardOf(name)], redisScripts.setHealth, s.args(name, h, max(latency.Nanoseconds(), 0))...).Err(); err != nil {
		s.log.Error("lease store: recording a probe verdict failed", "member", name, "error", s.wrap("set health", err))
		s.mu.Lock()
		s.dirty = s.haveWant
		s.mu.Unlock()
	}
}

// Answered is Store.Answered (pool.AnswerSink): the member answered a
// probe, so its rest for its own failures ends. Unknown names are
// ignored; a store that cannot be reached loses only the early end (the
// rest still ends with its window).
func (s *RedisStore) Answered(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.runIn(ctx, "answered", s.shards[s.shardOf(name)], redisScripts.answered, s.args(name)...).Err(); err != nil {
		s.log.Warn("lease store: ending a member's failure rest after a passing probe failed", "member", name, "error", s.wrap("answered", err))
	}
}

// ListMembers is Members with the store's error: the lease API answers a
// failure with 503 store_unavailable.
func (s *RedisStore) ListMembers(ctx context.Context) ([]pool.MemberStatus, error) {
	out, _, err := s.members(ctx)
	return out, err
}

func (s *RedisStore) members(ctx context.Context) ([]pool.MemberStatus, int, error) {
	out, live, _, err := s.membersCooldowns(ctx)
	return out, live, err
}

// ListCooldowns lists the running cooldowns of current members, sorted by
// target then member (pool.SortCooldowns), read in one script with the members.
func (s *RedisStore) ListCooldowns(ctx context.Context) ([]pool.Cooldown, error) {
	_, _, cs, err := s.membersCooldowns(ctx)
	pool.SortCooldowns(cs)
	return cs, err
}

// membersCooldowns reads the members, the live lease count and the running
// cooldowns with their reasons.
func (s *RedisStore) membersCooldowns(ctx context.Context) ([]pool.MemberStatus, int, []pool.Cooldown, error) {
	var rows []any
	live := 0
	for _, keys := range s.shards {
		res, err := s.runIn(ctx, "members", keys, redisScripts.members, s.args()...).Slice()
		if err != nil {
			return nil, 0, nil, s.wrap("members", err)
		}
		if len(res) < 2 {
			return nil, 0, nil, fmt.Errorf("lease store: members: malformed reply")
		}
		live += toInt(res[1])
		rows = append(rows, res[2:]...)
	}
	out := make([]pool.MemberStatus, 0, len(rows))
	var cools []pool.Cooldown
	for _, r := range rows {
		row, ok := r.([]any)
		if !ok || len(row) != 6 {
			return nil, 0, nil, fmt.Errorf("lease store: members: malformed row")
		}
		m, err := s.member(toString(row[0]), toString(row[1]))
		if err != nil {
			return nil, 0, nil, err
		}
		m.Attributes = maps.Clone(m.Attributes)
		st := pool.MemberStatus{
			Member:       m,
			Healthy:      toString(row[2]) == "1",
			Latency:      time.Duration(toInt(row[3])),
			ActiveLeases: toInt(row[4]),
		}
		cs, _ := row[5].([]any)
		for i := 0; i+2 < len(cs); i += 3 {
			if st.Cooldowns == nil {
				st.Cooldowns = map[string]time.Time{}
			}
			target, until := toString(cs[i]), time.UnixMilli(int64(toInt(cs[i+1])))
			st.Cooldowns[target] = until
			cools = append(cools, pool.Cooldown{Member: m.Name, Target: target, Until: until, Reason: rotation.Result(toString(cs[i+2]))})
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b pool.MemberStatus) int { return strings.Compare(a.Name, b.Name) })
	return out, live, cools, nil
}

// Members lists the current members sorted by name, as Store.Members; when
// Redis cannot be read it logs and returns nil (the metrics collector's
// view: no members known). The lease API uses ListMembers.
func (s *RedisStore) Members() []pool.MemberStatus {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _, err := s.members(ctx)
	if err != nil {
		s.log.Error("lease store: listing members failed", "error", err)
		return nil
	}
	return out
}

// ActiveLeases counts unexpired, unreleased leases (0 when Redis cannot be read).
func (s *RedisStore) ActiveLeases() int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, n, err := s.members(ctx)
	if err != nil {
		return 0
	}
	return n
}

// ActiveCooldowns counts running cooldowns of current members (0 when
// Redis cannot be read).
func (s *RedisStore) ActiveCooldowns() int {
	n := 0
	for _, m := range s.Members() {
		n += len(m.Cooldowns)
	}
	return n
}

// Start re-writes the member list every minute, and at every
// SweepInterval after a failed write, until ctx ends. Expiry needs no
// sweep: keys carry TTLs and every script applies what the clock ended.
func (s *RedisStore) Start(ctx context.Context) {
	t := time.NewTicker(min(s.o.SweepInterval, redisReassertEvery))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.mu.Lock()
			due := s.haveWant && (s.dirty || time.Since(s.lastWrite) >= redisReassertEvery)
			s.mu.Unlock()
			if due {
				s.writeMembers(ctx)
			}
		}
	}
}

func toInt(v any) int {
	switch x := v.(type) {
	case int64:
		return int(x)
	case string:
		n, _ := strconv.Atoi(x)
		return n
	}
	return 0
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}

// shardOf is the group a member belongs to: a hash of its name.
func (s *RedisStore) shardOf(name string) int {
	if len(s.shards) == 1 {
		return 0
	}
	return int(fnv32(name) % uint32(len(s.shards)))
}

// leaseShard is the group a lease ID names ("s<N>-..."; none: the first).
// An ID naming no group of this store is looked up in the first, which
// does not know it.
func (s *RedisStore) leaseShard(id string) int {
	rest, ok := strings.CutPrefix(id, "s")
	if !ok {
		return 0
	}
	num, _, ok := strings.Cut(rest, "-")
	g, err := strconv.Atoi(num)
	if !ok || err != nil || g < 1 || g >= len(s.shards) {
		return 0
	}
	return g
}

// fnv32 is FNV-1a, 32 bits: the member and idempotency key hash.
func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// shardTag is group i's hash tag of n: the first "prefix:s<i>:<k>" whose
// Cluster slot lies in the middle half of the i-th of n equal ranges of
// the 16384 slots, so that the tags are fixed by prefix and n alone (every
// store of a fleet agrees) and spread over evenly split primaries.
func shardTag(prefix string, i, n int) string {
	const slots = 16384
	lo, hi := i*slots/n, (i+1)*slots/n
	w := hi - lo
	for k := 0; ; k++ {
		tag := prefix + ":s" + strconv.Itoa(i) + ":" + strconv.Itoa(k)
		if slot := int(crc16(tag) % slots); slot >= lo+w/4 && slot < hi-w/4 {
			return tag
		}
	}
}

// crc16 is CRC-16/XMODEM, Redis Cluster's key hash.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
