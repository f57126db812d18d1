package redisstore

// The pace script: the SitePacer decisions, one atomic script each, on the
// server's clock (µs). It touches only the keys of one site, under
// KEYS[1] = "{prefix:p:site}:", so the pace of different sites hashes to
// different Cluster slots and spreads over a Cluster's shards:
//
//	S.."h"  HASH  l = the learnt pace "<interval ns>:<cut interval ns>:
//	              <cause>:<cut at µs>:<cuts>" (absent: never slowed, or
//	              decayed); s:<member> = "<slot µs>:<previous slot µs>"
//	              (the member's last reserved slot, and the one before it
//	              for a slot given back; empty once given back to)
//	S.."k"  SET   members the site banned since its last cut
//	S.."f"  ZSET  places in flight: holder -> when it stops counting (µs)
//
// ARGV[1] is the operation, ARGV[2] the quiet period after which a
// learnt pace decays (µs). The index of slowed sites ("{prefix}:paced",
// by cut time) is on the pool's slot; the caller keeps it from the
// transitions this script reports.
const redisPaceLua = `
local S = KEYS[1]
local H, K, F = S .. 'h', S .. 'k', S .. 'f'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op, QUIET = ARGV[1], tonumber(ARGV[2])

local function keep(k, us)
  local ms = math.ceil(us / 1000)
  if redis.call('PTTL', k) < ms then redis.call('PEXPIRE', k, ms) end
end
-- learnt returns the site's learnt pace, or nil and whether it decayed
-- just now (the caller then drops it from the index).
local function learnt()
  local v = redis.call('HGET', H, 'l')
  if not v then return nil, false end
  local iv, cut, cause, at, cuts = string.match(v, '^(%d+):(%d+):([^:]*):(%d+):(%d+)$')
  at = tonumber(at)
  if now - at >= QUIET then
    redis.call('HDEL', H, 'l')
    redis.call('DEL', K)
    return nil, true
  end
  return {iv = tonumber(iv), cut = tonumber(cut), cause = cause, at = at, cuts = tonumber(cuts)}, false
end
local function enc(L)
  if not L then return '' end
  return string.format('%d:%d:%s:%d:%d', L.iv, L.cut, L.cause, L.at, L.cuts)
end
local function save(L)
  redis.call('HSET', H, 'l', enc(L))
  keep(H, QUIET + 60000000)
end

if op == 'reserve' then
  -- [3] member, [4] min interval µs, [5] auto, [6] max wait µs.
  -- Returns {reserved, wait µs, token, learnt, decayed}.
  local m, iv, maxwait = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[6])
  local L, decayed = nil, false
  if ARGV[5] == '1' then L, decayed = learnt() end
  if L then iv = math.max(iv, math.ceil(L.iv / 1000)) end
  local dflag = decayed and 1 or 0
  if iv <= 0 then return {0, 0, 0, enc(L), dflag} end
  local at, prev = now, ''
  local cur = redis.call('HGET', H, 's:' .. m)
  if cur then
    prev = string.match(cur, '^(%d+)')
    local nx = tonumber(prev) + iv
    if nx > now then at = nx end
  end
  if at - now > maxwait then return {0, at - now, 0, enc(L), dflag} end
  redis.call('HSET', H, 's:' .. m, string.format('%d:%s', at, prev))
  keep(H, at - now + iv + 60000000)
  return {1, at - now, at, enc(L), dflag}
elseif op == 'return' then
  -- [3] member, [4] token (the slot µs).
  local cur = redis.call('HGET', H, 's:' .. ARGV[3])
  if not cur then return 0 end
  local at, prev = string.match(cur, '^(%d+):(%d*)$')
  -- Only the last slot goes back, and only to a known predecessor: the
  -- one before that is not kept, so a second return keeps its slot.
  if at ~= ARGV[4] or prev == '' then return 0 end
  redis.call('HSET', H, 's:' .. ARGV[3], prev .. ':')
  return 1
elseif op == 'enter' then
  -- [3] holder, [4] limit (0 none), [5] hold µs. Returns 1 when in.
  redis.call('ZREMRANGEBYSCORE', F, '-inf', now)
  if redis.call('ZSCORE', F, ARGV[3]) then return 1 end
  local limit = tonumber(ARGV[4])
  if limit > 0 and redis.call('ZCARD', F) >= limit then return 0 end
  local hold = tonumber(ARGV[5])
  redis.call('ZADD', F, now + hold, ARGV[3])
  keep(F, hold + 60000000)
  return 1
elseif op == 'leave' then
  return redis.call('ZREM', F, ARGV[3])
elseif op == 'answer' then
  -- [3] member, [4] result, [5] seen cuts, [6] first cut ns, [7] max
  -- interval ns, [8] increase steps, [9] unlimited below ns.
  -- Returns {learnt, transition}: 1 cut (the caller indexes the site),
  -- -1 unlimited again (the caller drops it), 0 neither.
  local m, res, seen = ARGV[3], ARGV[4], tonumber(ARGV[5])
  local L, decayed = learnt()
  local gone = decayed and -1 or 0
  if res ~= 'rate_limited' and res ~= 'banned' then
    if not L then return {'', gone} end
    -- Additive increase, as rotation.LearntPace.Answered.
    local cut = L.cut
    if cut <= 0 then cut = L.iv end
    local rate = 1 / (L.iv / 1e9) + 1 / ((cut / 1e9) * tonumber(ARGV[8]))
    local nx = math.floor(1e9 / rate)
    if nx < tonumber(ARGV[9]) then
      redis.call('HDEL', H, 'l')
      redis.call('DEL', K)
      return {'', -1}
    end
    L.iv = nx
    save(L)
    return {enc(L), 0}
  end
  -- Multiplicative decrease, as rotation.LearntPace.Ban: a ban through a
  -- member banned since the last cut, or to a request paced under an
  -- older cut, is no news.
  if L and (seen < L.cuts or redis.call('SISMEMBER', K, m) == 1) then
    redis.call('SADD', K, m)
    return {enc(L), 0}
  end
  local nx = tonumber(ARGV[6])
  if L then nx = math.min(2 * L.iv, tonumber(ARGV[7])) end
  L = {iv = nx, cut = nx, cause = res, at = now, cuts = (L and L.cuts or 0) + 1}
  save(L)
  redis.call('DEL', K)
  redis.call('SADD', K, m)
  keep(K, QUIET + 60000000)
  return {enc(L), 1}
end
return redis.error_reply('unknown pace operation ' .. tostring(op))
`

// redisSlowedLua lists the sites of the index KEYS[1] ("{prefix}:paced",
// site -> its last cut in µs) cut less than ARGV[1] µs ago, dropping the
// older ones.
const redisSlowedLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]))
return redis.call('ZRANGE', KEYS[1], 0, -1)
`
