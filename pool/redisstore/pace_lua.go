package redisstore

// The pace script: the SitePacer decisions, one atomic script each, on the
// server's clock (µs). It touches only the keys of one site, under
// KEYS[1] = "{prefix:p:site}:", so the pace of different sites hashes to
// different Cluster slots and spreads over a Cluster's shards:
//
//	S.."h"  HASH  l = the learnt pace "<interval ns>:<cut interval ns>:
//	              <cause>:<cut at µs>:<cuts>:<pause ns>:<floor ns>:<steps>:
//	              <memory ns>:<halvings faded>" (absent: never slowed, or
//	              ended; the first five alone are read as the fixed
//	              rule's, written before the last five were); s:<member> = "<slot µs>:<previous slot µs>"
//	              (the member's last reserved slot, and the one before it
//	              for a slot given back; empty once given back to)
//	S.."k"  SET   members the site banned since its last cut
//	S.."f"  ZSET  places in flight: holder -> when it stops counting (µs)
//
// ARGV[1] is the operation, ARGV[2] the quiet period after which a
// learnt pace starts to fade (µs), ARGV[3] the interval below which it
// ends (ns). The index of slowed sites ("{prefix}:paced",
// by cut time) is on the pool's slot; the caller keeps it from the
// transitions this script reports.
const redisPaceLua = `
local S = KEYS[1]
local H, K, F = S .. 'h', S .. 'k', S .. 'f'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op, QUIET, UNLIMITED = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local function keep(k, us)
  local ms = math.ceil(us / 1000)
  if redis.call('PTTL', k) < ms then redis.call('PEXPIRE', k, ms) end
end
local function enc(L)
  if not L then return '' end
  return string.format('%d:%d:%s:%d:%d:%d:%d:%d:%d:%d', L.iv, L.cut, L.cause, L.at, L.cuts, L.pause, L.floor, L.steps, L.memory, L.faded)
end
-- remembered is how long (µs) after its cut a learnt pace lasts: the
-- quiet period, then one memory per halving down to UNLIMITED.
local function remembered(L)
  if L.memory <= 0 then return QUIET end
  local halvings = math.floor(math.log(math.max(L.iv, 1) / UNLIMITED) / math.log(2)) + 1
  return QUIET + math.max(halvings, 1) * math.ceil(L.memory / 1000)
end
local function save(L)
  redis.call('HSET', H, 'l', enc(L))
  keep(H, remembered(L) + 60000000)
end
-- learnt returns the site's learnt pace, faded to now (rotation's
-- LearntPace.Decayed), or nil and whether it ended just now (the caller
-- then drops it from the index).
local function learnt()
  local v = redis.call('HGET', H, 'l')
  if not v then return nil, false end
  local iv, cut, cause, at, cuts, pause, floor, steps, memory, faded = string.match(v,
    '^(%d+):(%d+):([^:]*):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')
  if not iv then
    iv, cut, cause, at, cuts = string.match(v, '^(%d+):(%d+):([^:]*):(%d+):(%d+)$')
    pause, floor, steps, memory, faded = 0, 0, 0, 0, 0
  end
  local L = {iv = tonumber(iv), cut = tonumber(cut), cause = cause, at = tonumber(at), cuts = tonumber(cuts),
    pause = tonumber(pause), floor = tonumber(floor), steps = tonumber(steps), memory = tonumber(memory), faded = tonumber(faded)}
  local quiet = now - L.at - QUIET
  if quiet < 0 then return L, false end
  if L.memory <= 0 then
    redis.call('HDEL', H, 'l')
    redis.call('DEL', K)
    return nil, true
  end
  local n = math.min(math.floor(quiet / (L.memory / 1000)), 62) + 1
  if n <= L.faded then return L, false end
  local d = 2 ^ (n - L.faded)
  L.iv = math.floor(L.iv / d)
  L.floor = math.floor(L.floor / d)
  L.faded = n
  if L.iv < UNLIMITED then
    redis.call('HDEL', H, 'l')
    redis.call('DEL', K)
    return nil, true
  end
  save(L)
  return L, false
end

if op == 'reserve' then
  -- [4] member, [5] min interval µs, [6] auto, [7] max wait µs.
  -- Returns {reserved, wait µs, token, learnt, decayed}.
  local m, iv, maxwait = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[7])
  local L, decayed = nil, false
  if ARGV[6] == '1' then L, decayed = learnt() end
  if L then iv = math.max(iv, math.ceil(L.iv / 1000)) end
  local dflag = decayed and 1 or 0
  if iv <= 0 then return {0, 0, 0, enc(L), dflag} end
  local at, prev = now, ''
  if L and L.pause > 0 then
    -- The cut paused the whole site: no member's slot before its end.
    local pu = L.at + math.ceil(L.pause / 1000)
    if pu > at then at = pu end
  end
  local cur = redis.call('HGET', H, 's:' .. m)
  if cur then
    prev = string.match(cur, '^(%d+)')
    local nx = tonumber(prev) + iv
    if nx > at then at = nx end
  end
  if at - now > maxwait then return {0, at - now, 0, enc(L), dflag} end
  redis.call('HSET', H, 's:' .. m, string.format('%d:%s', at, prev))
  keep(H, at - now + iv + 60000000)
  return {1, at - now, at, enc(L), dflag}
elseif op == 'return' then
  -- [4] member, [5] token (the slot µs).
  local cur = redis.call('HGET', H, 's:' .. ARGV[4])
  if not cur then return 0 end
  local at, prev = string.match(cur, '^(%d+):(%d*)$')
  -- Only the last slot goes back, and only to a known predecessor: the
  -- one before that is not kept, so a second return keeps its slot.
  if at ~= ARGV[5] or prev == '' then return 0 end
  redis.call('HSET', H, 's:' .. ARGV[4], prev .. ':')
  return 1
elseif op == 'enter' then
  -- [4] holder, [5] limit (0 none), [6] hold µs. Returns 1 when in.
  redis.call('ZREMRANGEBYSCORE', F, '-inf', now)
  if redis.call('ZSCORE', F, ARGV[4]) then return 1 end
  local limit = tonumber(ARGV[5])
  if limit > 0 and redis.call('ZCARD', F) >= limit then return 0 end
  local hold = tonumber(ARGV[6])
  redis.call('ZADD', F, now + hold, ARGV[4])
  keep(F, hold + 60000000)
  return 1
elseif op == 'leave' then
  return redis.call('ZREM', F, ARGV[4])
elseif op == 'answer' then
  -- [4] member, [5] result, [6] seen cuts, [7] first cut's interval ns
  -- (0: [8]), [8] the fixed first cut ns, [9] max interval ns, [10]
  -- increase steps (when the pace has none), [11] first cut's pause ns,
  -- [12] floor ns, [13] steps, [14] memory ns.
  -- Returns {learnt, transition, remembered µs}: 1 cut (the caller
  -- indexes the site), -1 unlimited again (the caller drops it), 0 neither.
  local m, res, seen = ARGV[4], ARGV[5], tonumber(ARGV[6])
  local L, decayed = learnt()
  local gone = decayed and -1 or 0
  if res ~= 'rate_limited' and res ~= 'banned' then
    if not L then return {'', gone, 0} end
    -- Additive increase, as rotation.LearntPace.Answered.
    local cut = L.cut
    if cut <= 0 then cut = L.iv end
    local steps = L.steps
    if steps <= 0 then steps = tonumber(ARGV[10]) end
    local rate = 1 / (L.iv / 1e9) + 1 / ((cut / 1e9) * steps)
    local nx = math.max(math.floor(1e9 / rate), L.floor)
    if nx < UNLIMITED then
      redis.call('HDEL', H, 'l')
      redis.call('DEL', K)
      return {'', -1, 0}
    end
    L.iv = nx
    save(L)
    return {enc(L), 0, 0}
  end
  -- Multiplicative decrease, as rotation.LearntPace.BanWith: a ban
  -- through a member banned since the last cut, or to a request paced
  -- under an older cut, is no news.
  if L and (seen < L.cuts or redis.call('SISMEMBER', K, m) == 1) then
    redis.call('SADD', K, m)
    return {enc(L), 0, 0}
  end
  local maxiv = tonumber(ARGV[9])
  if L then
    local nx = math.min(2 * L.iv, maxiv)
    local fl = math.min(math.max(L.floor, L.iv + math.floor(L.iv / 10)), nx)
    -- A later cut pauses for the longer of the last pause and its own
    -- ban's cut's (rotation.LearntPace.BanWith).
    L = {iv = nx, cut = nx, cause = res, at = now, cuts = L.cuts + 1, pause = math.max(L.pause, tonumber(ARGV[11])), floor = fl, steps = L.steps, memory = L.memory, faded = 0}
  else
    local nx = tonumber(ARGV[7])
    if nx <= 0 then nx = tonumber(ARGV[8]) end
    nx = math.min(nx, maxiv)
    L = {iv = nx, cut = nx, cause = res, at = now, cuts = 1, pause = tonumber(ARGV[11]), floor = math.min(tonumber(ARGV[12]), nx), steps = tonumber(ARGV[13]), memory = tonumber(ARGV[14]), faded = 0}
  end
  save(L)
  redis.call('DEL', K)
  redis.call('SADD', K, m)
  keep(K, remembered(L) + 60000000)
  return {enc(L), 1, L.at + remembered(L)}
end
return redis.error_reply('unknown pace operation ' .. tostring(op))
`

// redisSlowedLua lists the sites of the index KEYS[1] ("{prefix}:paced",
// site -> until when its learnt pace is remembered, µs), dropping those
// past it, and past ARGV[1] entries those remembered the shortest.
const redisSlowedLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[1]) - 1)
return redis.call('ZRANGE', KEYS[1], 0, -1)
`
