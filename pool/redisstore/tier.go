package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// A site's place on the tiers is decided in Go (pool.TierAnswer.Apply,
// pool.StartOf: the rule has one definition) and kept in Redis as one
// string per site. A decision reads the place with the store's time, then
// writes what it decided only if the place is still what it read (a
// compare-and-set script), reading again when another gateway changed it
// meanwhile. Unlike the pace, no rule is written twice (Go and Lua).
var (
	redisTierRead = redis.NewScript(`
local t = redis.call('TIME')
return {tonumber(t[1]) * 1000000 + tonumber(t[2]), redis.call('GET', KEYS[1]) or ''}`)
	// The new place is written when the key holds the old one, or holds
	// the new one already: a call retried after its reply was lost (a
	// failover) must not read as a conflict and be applied twice.
	redisTierCAS = redis.NewScript(`
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] and cur ~= ARGV[2] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1`)
)

// maxTierCAS bounds the tries of one decision against writers changing
// the site meanwhile; past it the decision fails as the store's error.
const maxTierCAS = 16

var errTierContended = errors.New("the site's tier changed under every try")

// tierKey is the site's key: its own hash tag under the prefix, so that
// sites spread over a Cluster's slots (a site holding a brace is hashed,
// as for the pace).
func (s *RedisStore) tierKey(site string) string {
	if strings.ContainsAny(site, "{}") {
		sum := sha256.Sum256([]byte(site))
		site = "#" + hex.EncodeToString(sum[:16])
	}
	return "{" + s.prefix + ":t:" + site + "}"
}

// decideTier reads site's place and the store's time, and writes what
// decide makes of them unless it is the same; it returns the place
// decided on and decide's other answer.
func decideTier[T any](ctx context.Context, s *RedisStore, site string, decide func(p rotation.SiteTier, now time.Time) (rotation.SiteTier, T)) (rotation.SiteTier, T, error) {
	var zero T
	key := []string{s.tierKey(site)}
	life := pool.TierLife.Milliseconds()
	for range maxTierCAS {
		var read []any
		err := s.do(ctx, "tier_read", func(ctx context.Context) error {
			var err error
			read, err = redisTierRead.Run(ctx, s.rdb, key).Slice()
			return err
		})
		if err != nil {
			return rotation.SiteTier{}, zero, s.wrap("tier", err)
		}
		if len(read) != 2 {
			return rotation.SiteTier{}, zero, fmt.Errorf("lease store: tier: malformed reply %v", read)
		}
		now := time.UnixMicro(int64(toInt(read[0])))
		old := toString(read[1])
		p, err := parseSiteTier(old)
		if err != nil {
			return rotation.SiteTier{}, zero, err
		}
		next, out := decide(p, now)
		enc := formatSiteTier(next)
		if enc == old {
			return next, out, nil
		}
		var ok int
		err = s.do(ctx, "tier_write", func(ctx context.Context) error {
			n, err := redisTierCAS.Run(ctx, s.rdb, key, old, enc, life).Int()
			ok = n
			return err
		})
		if err != nil {
			return rotation.SiteTier{}, zero, s.wrap("tier", err)
		}
		if ok == 1 {
			return next, out, nil
		}
	}
	return rotation.SiteTier{}, zero, s.wrap("tier", errTierContended)
}

// StartTier is pool.SiteTierKeeper.StartTier.
func (s *RedisStore) StartTier(ctx context.Context, site string, rg rotation.TierRange, rule rotation.TierRule) (pool.TierStart, error) {
	_, st, err := decideTier(ctx, s, site, func(p rotation.SiteTier, now time.Time) (rotation.SiteTier, pool.TierStart) {
		st, next := pool.StartOf(p, now, rg, rule)
		return next, st
	})
	return st, err
}

// TierAnswered is pool.SiteTierKeeper.TierAnswered.
func (s *RedisStore) TierAnswered(ctx context.Context, a pool.TierAnswer) (rotation.SiteTier, error) {
	if err := a.Check(); err != nil {
		return rotation.SiteTier{}, err
	}
	p, _, err := decideTier(ctx, s, a.Site, func(p rotation.SiteTier, now time.Time) (rotation.SiteTier, struct{}) {
		return a.Apply(p, now), struct{}{}
	})
	return p, err
}

// formatSiteTier is p as its key's value: "" for the zero place (the key
// goes), else its fields, times in Unix microseconds (0: none).
func formatSiteTier(p rotation.SiteTier) string {
	if p == (rotation.SiteTier{}) {
		return ""
	}
	us := func(t time.Time) string {
		if t.IsZero() {
			return "0"
		}
		return strconv.FormatInt(t.UnixMicro(), 10)
	}
	down := "0"
	if p.Down {
		down = "1"
	}
	return strings.Join([]string{"1", strconv.Itoa(p.Level), us(p.Since), strconv.Itoa(p.Bans), us(p.BansFrom),
		strconv.Itoa(p.Climbs), us(p.LastProbe), strconv.Itoa(p.Moves), down}, ":")
}

// parseSiteTier reads formatSiteTier's value ("1:" a version, so that a
// later layout is told apart).
func parseSiteTier(v string) (rotation.SiteTier, error) {
	if v == "" {
		return rotation.SiteTier{}, nil
	}
	f := strings.Split(v, ":")
	if len(f) != 9 || f[0] != "1" || (f[8] != "0" && f[8] != "1") {
		return rotation.SiteTier{}, fmt.Errorf("lease store: tier: malformed place %q", v)
	}
	var n [7]int64
	for i := range n {
		x, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil || x < 0 {
			return rotation.SiteTier{}, fmt.Errorf("lease store: tier: malformed place %q", v)
		}
		n[i] = x
	}
	at := func(x int64) time.Time {
		if x == 0 {
			return time.Time{}
		}
		return time.UnixMicro(x)
	}
	return rotation.SiteTier{Level: int(n[0]), Since: at(n[1]), Bans: int(n[2]), BansFrom: at(n[3]),
		Climbs: int(n[4]), LastProbe: at(n[5]), Moves: int(n[6]), Down: f[8] == "1"}, nil
}
