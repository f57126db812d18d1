package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proxyfleet/proxyfleet/pool/quota"
)

// The quota script: pool.QuotaKeeper's decisions, quota's arithmetic
// (GCRA for the rates, a count of unexpired places for the leases), one
// atomic script each on the server's clock (µs). It touches only one
// client's keys, under KEYS[1] = "{prefix:q:client}:", so clients spread
// over a Cluster's slots:
//
//	C.."r"        STRING  the client's overall rate's theoretical arrival time (µs)
//	C.."s:"..site STRING  its rate at site's
//	C.."l"        ZSET    its leases' places: holder -> when the place ends (µs)
//	C.."b:"..day  STRING  the bytes its requests carried on that UTC day (days since the epoch)
//
// Every key expires once it limits nothing: a rate when its burst is
// whole again, the places with the last of them.
const redisQuotaLua = `
local C = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op = ARGV[1]
local day = math.floor(tonumber(t[1]) / 86400)
local B = C .. 'b:' .. day

if op == 'req' then
  -- ARGV: site, interval µs, burst, site interval µs, site burst (0: no
  -- rate), bytes per day (0: no limit)
  local R, S = C .. 'r', C .. 's:' .. ARGV[2]
  local bpd = tonumber(ARGV[7])
  if bpd > 0 and tonumber(redis.call('GET', B) or '0') >= bpd then
    return {0, 'bytes-per-day', (day + 1) * 86400000000 - now}
  end
  local function take(key, iv, burst)
    local tat = tonumber(redis.call('GET', key) or '0')
    local nxt = math.max(tat, now) + iv
    local over = nxt - now - burst * iv
    if over > 0 then return nil, over end
    return nxt, 0
  end
  local iv, burst, siv, sburst = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local nr, ns, wait, which = nil, nil, 0, ''
  if iv > 0 then
    local n, over = take(R, iv, burst)
    if n then nr = n else wait, which = over, 'rps' end
  end
  if siv > 0 then
    local n, over = take(S, siv, sburst)
    if n then ns = n elseif over > wait then wait, which = over, 'site-rps' end
  end
  if which ~= '' then return {0, which, wait} end
  if nr then redis.call('SET', R, string.format('%d', nr), 'PX', math.ceil((nr - now) / 1000) + 1000) end
  if ns then redis.call('SET', S, string.format('%d', ns), 'PX', math.ceil((ns - now) / 1000) + 1000) end
  return {1, '', 0}
elseif op == 'lease' then
  -- ARGV: holder, limit, ttl µs
  local L = C .. 'l'
  redis.call('ZREMRANGEBYSCORE', L, '-inf', now)
  if redis.call('ZCARD', L) >= tonumber(ARGV[3]) then return {0, 'leases', 0} end
  local ttl = tonumber(ARGV[4])
  redis.call('ZADD', L, string.format('%d', now + ttl), ARGV[2])
  local ms = math.ceil(ttl / 1000) + 1000
  if redis.call('PTTL', L) < ms then redis.call('PEXPIRE', L, ms) end
  return {1, '', 0}
elseif op == 'bytes' then
  -- ARGV: n; the count lasts its day and an hour.
  redis.call('INCRBY', B, ARGV[2])
  redis.call('PEXPIRE', B, math.ceil(((day + 1) * 86400000000 - now) / 1000) + 3600000)
  return {1, '', 0}
elseif op == 'return' then
  redis.call('ZREM', C .. 'l', ARGV[2])
  return {1, '', 0}
end
return redis.error_reply('quota: unknown operation ' .. op)
`

var redisQuota = redis.NewScript(redisQuotaLua)

// quotaKeys is KEYS for the quota script of client (a token client's
// name: a DNS label, never a brace).
func (s *RedisStore) quotaKeys(client string) []string {
	return []string{"{" + s.prefix + ":q:" + client + "}:"}
}

// runQuota is one quota script call for client; a refusal is a
// *quota.Refusal with limit.
func (s *RedisStore) runQuota(ctx context.Context, op, client string, limit func(quota.Which) float64, argv ...any) error {
	var res []any
	err := s.do(ctx, "quota_"+op, func(ctx context.Context) error {
		var err error
		res, err = redisQuota.Run(ctx, s.rdb, s.quotaKeys(client), append([]any{op}, argv...)...).Slice()
		return err
	})
	if err != nil {
		return s.wrap("quota", err)
	}
	if len(res) != 3 {
		return fmt.Errorf("lease store: quota: malformed reply %v", res)
	}
	if toInt(res[0]) == 1 {
		return nil
	}
	which := quota.Which(toString(res[1]))
	ref := &quota.Refusal{Which: which, Limit: limit(which), RetryAfter: time.Duration(toInt(res[2])) * time.Microsecond}
	if which == quota.WhichLeases {
		ref.RetryAfter = quota.LeaseRetry
	}
	return ref
}

// TakeRequest is pool.QuotaKeeper.TakeRequest as one script on the
// client's keys. Quota writes do not wait for a replica: a failover that
// loses the last ones lets a client run one burst early.
func (s *RedisStore) TakeRequest(ctx context.Context, client, site string, l quota.Limits) error {
	if l.RPS <= 0 && l.SiteRPS <= 0 && l.BytesPerDay <= 0 {
		return nil
	}
	var iv, siv int64
	if l.RPS > 0 {
		iv = ceilMicros(quota.Interval(l.RPS))
	}
	if l.SiteRPS > 0 {
		siv = ceilMicros(quota.Interval(l.SiteRPS))
	}
	return s.runQuota(ctx, "req", client, func(w quota.Which) float64 {
		switch w {
		case quota.WhichSiteRPS:
			return l.SiteRPS
		case quota.WhichBytes:
			return float64(l.BytesPerDay)
		}
		return l.RPS
	}, site, iv, quota.Burst(l.RPS), siv, quota.Burst(l.SiteRPS), max(l.BytesPerDay, 0))
}

// AddBytes is pool.QuotaKeeper.AddBytes.
func (s *RedisStore) AddBytes(ctx context.Context, client string, n int64) error {
	if n <= 0 {
		return nil
	}
	return s.runQuota(ctx, "bytes", client, func(quota.Which) float64 { return 0 }, n)
}

// TakeLease is pool.QuotaKeeper.TakeLease.
func (s *RedisStore) TakeLease(ctx context.Context, client, holder string, l quota.Limits, ttl time.Duration) error {
	if l.Leases <= 0 {
		return nil
	}
	return s.runQuota(ctx, "lease", client, func(quota.Which) float64 { return float64(l.Leases) }, holder, l.Leases, ceilMicros(ttl))
}

// ReturnLease is pool.QuotaKeeper.ReturnLease.
func (s *RedisStore) ReturnLease(ctx context.Context, client, holder string) error {
	return s.runQuota(ctx, "return", client, func(quota.Which) float64 { return 0 }, holder)
}
