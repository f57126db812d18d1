package redisstore

// The Redis store's server-side scripts. Each runs atomically on the
// server, reads the server's clock (TIME) so that every replica and gateway
// agrees on when a lease or a cooldown ends, and touches only keys under
// KEYS[1] = "{prefix}:", so in Redis Cluster every key of a pool hashes to
// the slot of {prefix} and a script never crosses slots.
//
// Key layout under B = KEYS[1]:
//
//	B.."members"   SET   current member names
//	B.."m:"..name  HASH  def (JSON: URL with credentials, source address,
//	                     attributes), f (endpoint fingerprint), aj (attributes
//	                     JSON), a:<k> (one field per attribute, what selectors
//	                     read), gen (generation: a new one per endpoint),
//	                     h (1 healthy / 0), lat (ns, 0 unknown), seq (last
//	                     choice), act (active leases), ent (its entry in sel),
//	                     ap (its attribute pairs, see sp:)
//	B.."sel"       ZSET  the members that can be chosen for some target
//	                     (healthy, not resting for every target): score =
//	                     active leases, member = %020d(seq)|%020d(latency,
//	                     unknown = 20 nines)|name, so Redis' order (score,
//	                     then bytes) is exactly rotation.Less
//	B.."sp:"..k.."\2"..v  ZSET  the members of sel with the attribute k=v,
//	                     with the same scores and entries: a selector walks
//	                     its pair's set instead of sel, passing only members
//	                     it matches (the member hash's ap lists its pairs,
//	                     "k\2v" joined by "\1"); B.."pairs" SET names them
//	                     all, for the TTL refresh
//	B.."rest"      ZSET  members cooling down for every target, by its end
//	B.."exp"       ZSET  live leases (unexpired, unreleased) by end: the
//	                     expiry index that counts active leases down exactly
//	                     once, whether a lease ends by time or by release
//	B.."l:"..id    HASH  a lease: m (member), g (member generation), t
//	                     (target), ttl, exp, end (ms), rel; it lives until
//	                     end + the report window, a released one no longer
//	                     than it is among the group's most recent (relq).
//	                     Its definition is its member's (read for a retry's
//	                     answer), not a copy: leases are kept an hour,
//	                     members are few
//	B.."c:"..name  HASH  cooldowns by target ("" = every target):
//	                     "<until ms>:<strikes>:<reason>" (reason: the report
//	                     result that set until; a value without one reads
//	                     as reason ""); it lives until the last
//	                     window ends plus Cooldown.Max (the strike memory)
//	B.."relq"      LIST  released lease ids, oldest first: the ones past
//	                     ReleasedRetained are deleted (see retain)
//	B.."i:"..key   STRING idempotency key of an acquire -> lease id
//	B.."seq", B.."gen"   counters
//	B.."paced"     ZSET  sites with a learnt pace, by their last cut (µs);
//	                     the pace itself is under each site's own hash tag
//	                     (pace_lua.go)
//
// Every key carries a TTL: a pool-wide key gets one when it is created
// (born, the first INCR), and they are refreshed by every member write
// (each store that owns a member list re-asserts it every minute) and by
// acquires at most once a minute (every 64th choice asks); member hashes
// by the member write; the others end with what they describe.
const redisLuaPrelude = `
local B = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local LIFE = tonumber(ARGV[1])
local COOLMAX = tonumber(ARGV[2])
local SEL, REST, EXP, MEMBERS, RELQ = B .. 'sel', B .. 'rest', B .. 'exp', B .. 'members', B .. 'relq'

local function mkey(n) return B .. 'm:' .. n end
local function ckey(n) return B .. 'c:' .. n end
local function lkey(id) return B .. 'l:' .. id end

local function pad(x) return string.format('%020d', x) end
local function entry(seq, lat, name)
  local l = '99999999999999999999'
  if lat > 0 then l = pad(lat) end
  return pad(seq) .. '|' .. l .. '|' .. name
end

-- cool returns until, strikes, reason of one cooldown field, or nil when absent.
local function parsecool(v)
  if not v then return nil end
  local sep = string.find(v, ':', 1, true)
  local sep2 = string.find(v, ':', sep + 1, true)
  if not sep2 then return tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1)), '' end
  return tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1, sep2 - 1)), string.sub(v, sep2 + 1)
end
local function cool(name, target)
  return parsecool(redis.call('HGET', ckey(name), target))
end
-- cooling is when the member may serve target again (the later end of its
-- cooldown for target and for every target), false when it does not rest.
local function cooling(name, target)
  local vs, back = redis.call('HMGET', ckey(name), target, ''), false
  for i = 1, 2 do
    local u = parsecool(vs[i])
    if u and now < u and (not back or u > back) then back = u end
  end
  return back
end

-- born gives a pool-wide sorted set an add may just have created (it was
-- empty, so Redis had deleted it) its TTL at once, so no key ever lives
-- without one until the next refresh.
local function born(k)
  if redis.call('ZCARD', k) == 1 then redis.call('PEXPIRE', k, LIFE) end
end

-- pairkeys are the selection sets of a member's attribute pairs (its ap).
local function pairkeys(ap)
  local out = {}
  if not ap or ap == '' then return out end
  for p in string.gmatch(ap, '[^\1]+') do out[#out + 1] = B .. 'sp:' .. p end
  return out
end
-- idxadd puts an entry into sel and its member's pair sets; idxrem takes
-- it out of them, returning whether it was in sel.
local function idxadd(ps, score, ent)
  redis.call('ZADD', SEL, score, ent)
  born(SEL)
  for _, k in ipairs(ps) do
    redis.call('ZADD', k, score, ent)
    born(k)
  end
end
local function idxrem(ps, ent)
  local r = redis.call('ZREM', SEL, ent)
  for _, k in ipairs(ps) do redis.call('ZREM', k, ent) end
  return r == 1
end
-- idxmove gives an indexed entry old a new entry and score in sel and its
-- pair sets, adding the new one before the old one goes, so no set
-- empties on the way (Redis deletes an emptied set, and the add that
-- brought it back would have to give it its TTL again). It returns whether
-- old was indexed; indexed = true says so without asking.
local function idxmove(ps, old, score, new, indexed)
  if not indexed and not redis.call('ZSCORE', SEL, old) then return false end
  for _, zk in ipairs({SEL, unpack(ps)}) do
    redis.call('ZADD', zk, score, new)
    redis.call('ZREM', zk, old)
  end
  return true
end

-- place puts a member where its state says: in sel when it can be chosen
-- for some target, in rest while it cools down for every target, nowhere
-- when unhealthy or not a member. An indexed member is left alone.
local function place(name)
  local m = redis.call('HMGET', mkey(name), 'h', 'ent', 'act', 'ap')
  if not m[2] then return end
  if redis.call('ZSCORE', SEL, m[2]) then return end
  if m[1] ~= '1' then return end
  local u = cool(name, '')
  if u and now < u then
    redis.call('ZADD', REST, u, name)
    born(REST)
    return
  end
  idxadd(pairkeys(m[4]), tonumber(m[3]), m[2])
end

-- countdown takes one lease off its member's active count, unless the
-- member is gone or is a new upstream under the same name (fencing).
local function countdown(name, gen)
  local k = mkey(name)
  local m = redis.call('HMGET', k, 'gen', 'ent', 'ap')
  if m[1] ~= gen then return end
  local a = redis.call('HINCRBY', k, 'act', -1)
  -- XX: only an indexed entry moves (its pair sets hold it exactly when
  -- sel does), so no ZSCORE is needed to ask first.
  redis.call('ZADD', SEL, 'XX', a, m[2])
  for _, pk in ipairs(pairkeys(m[3])) do redis.call('ZADD', pk, 'XX', a, m[2]) end
end

-- retain keeps released lease id reportable among the keep most recently
-- released of its group (pool.StoreOptions.ReleasedRetained, as the memory
-- store does), besides the report window its key's TTL bounds: a gateway
-- rotating per request releases a lease per request, and an hour of those
-- would be most of Redis. The queue grows past keep by a sixteenth (at
-- most 1024) before its oldest go, three calls for many releases;
-- a queue far longer (keep lowered) shrinks by 1024 a release, so no call
-- ever passes Lua more than that.
local function retain(id, keep)
  if keep <= 0 then
    redis.call('DEL', lkey(id))
    return
  end
  local n = redis.call('RPUSH', RELQ, id)
  if n == 1 then redis.call('PEXPIRE', RELQ, LIFE) end
  if n > keep + math.min(math.floor(keep / 16), 1024) then
    -- LRANGE and LTRIM, not LPOP with a count (Redis 6.2 and later).
    local k = math.min(n - keep, 1024)
    local old = redis.call('LRANGE', RELQ, 0, k - 1)
    redis.call('LTRIM', RELQ, k, -1)
    for i = 1, #old do old[i] = lkey(old[i]) end
    redis.call('DEL', unpack(old))
  end
end

-- release ends lease id early: idempotent, and it counts down exactly once
-- (the expiry index holds a lease until it ends by time or by release).
local function release(id, keep)
  local lk = lkey(id)
  local l = redis.call('HMGET', lk, 'm', 'g', 'rel', 'end')
  if not l[1] or l[3] == '1' then return 0 end
  if now < tonumber(l[4]) then
    redis.call('HSET', lk, 'rel', 1, 'end', now)
    redis.call('PEXPIREAT', lk, now + COOLMAX)
  else
    redis.call('HSET', lk, 'rel', 1)
  end
  if redis.call('ZREM', EXP, id) == 1 then countdown(l[1], l[2]) end
  retain(id, keep)
  return 1
end

-- advance applies what the clock ended, as the memory store does: expired
-- leases stop counting, members whose every-target cooldown ended return.
local function advance()
  local ended = redis.call('ZRANGEBYSCORE', EXP, '-inf', now)
  for _, id in ipairs(ended) do
    redis.call('ZREM', EXP, id)
    local l = redis.call('HMGET', lkey(id), 'm', 'g')
    if l[1] then countdown(l[1], l[2]) end
  end
  local back = redis.call('ZRANGEBYSCORE', REST, '-inf', now)
  for _, n in ipairs(back) do
    redis.call('ZREM', REST, n)
    place(n)
  end
end

-- touch refreshes the pool-wide keys' TTLs: always when force (the member
-- write every owner repeats each minute), else at most once a minute, as
-- the members set's TTL tells. A refresh is six writes that every replica
-- and the AOF receive; once a minute is plenty for keys that live a day.
local function touch(force)
  if not force and redis.call('PTTL', MEMBERS) > LIFE - 60000 then return end
  for _, k in ipairs({MEMBERS, SEL, REST, EXP, RELQ, B .. 'seq', B .. 'gen', B .. 'pairs'}) do
    redis.call('PEXPIRE', k, LIFE)
  end
  for _, k in ipairs(redis.call('SMEMBERS', B .. 'pairs')) do
    if redis.call('PEXPIRE', k, LIFE) == 0 and force then redis.call('SREM', B .. 'pairs', k) end
  end
end

-- setcool writes one cooldown field and keeps the hash alive until the
-- window ends plus the strike memory.
local function setcool(name, field, u, s, r)
  local ck = ckey(name)
  redis.call('HSET', ck, field, string.format('%d:%d:%s', u, s, r))
  local want = u + COOLMAX - now
  if redis.call('PTTL', ck) < want then redis.call('PEXPIRE', ck, want) end
end

-- endrest ends name's rest for its own failures (a cooldown for every
-- target whose reason is upstream_failed), as pool.Store.endFailureRest;
-- a ban or site rest is left alone.
local function endrest(name)
  local u, s, r = cool(name, '')
  if u and now < u and r == 'upstream_failed' then
    setcool(name, '', now, s, r)
    redis.call('ZREM', REST, name)
    place(name)
  end
end

local function sethealth(name, h, lat)
  local k = mkey(name)
  local m = redis.call('HMGET', k, 'h', 'lat', 'seq', 'ent', 'act', 'ap')
  if not m[4] then return end
  local ent, ps = m[4], pairkeys(m[6])
  if lat ~= tonumber(m[2]) then
    local ne = entry(tonumber(m[3]), lat, name)
    idxmove(ps, ent, tonumber(m[5]), ne, false)
    redis.call('HSET', k, 'lat', lat, 'ent', ne)
    ent = ne
  end
  if h ~= m[1] then
    redis.call('HSET', k, 'h', h)
    idxrem(ps, ent)
    place(name)
  end
end
`

// redisAcquireLua: ARGV[3] lease id, [4] ttl ms, [5] target, [6] pinned
// proxy, [7] idempotency key, [8] max leases per member (0 unlimited), [9]
// released leases kept reportable (see retain), [10] n, [11..10+n] leases
// to release first (the caller's deferred releases, see
// RedisStore.ReleaseLater), [11+n..] selector pairs. Returns {"ok"|"dup",
// id, member, def, target, ttl, expiresAt} or {"nomatch", considered,
// atCapacity, inCooldown, unhealthy, ms until the first judged member's
// cooldown ends (0: none)}.
const redisAcquireLua = redisLuaPrelude + `
local nrel, keep = tonumber(ARGV[10]), tonumber(ARGV[9])
for i = 11, 10 + nrel do release(ARGV[i], keep) end
local sel0 = 11 + nrel
advance()
local id, ttl, target, proxy, idem, cap = ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8])
-- lease is the answer a retry gets: the lease's definition is its member's,
-- read here, not a copy in the lease (a copy per lease was most of a
-- lease's memory, kept an hour, and every copy held the credentials). A
-- lease whose member is gone or is another upstream now (fencing) is no
-- answer: that lease counts for nothing and its reports are stale, so the
-- retry takes a fresh one.
local function lease(kind, lid)
  local l = redis.call('HMGET', lkey(lid), 'm', 'g', 't', 'ttl', 'exp')
  if not l[1] then return nil end
  local m = redis.call('HMGET', mkey(l[1]), 'gen', 'def')
  if m[1] ~= l[2] then return nil end
  return {kind, lid, l[1], m[2], l[3], tonumber(l[4]), tonumber(l[5])}
end
-- A retry of this very call (the reply was lost) finds its lease by id; a
-- retry by the gateway on another replica finds it by idempotency key.
local again = lease('dup', id)
if again then return again end
if idem ~= '' then
  local prev = redis.call('GET', B .. 'i:' .. idem)
  if prev then
    again = lease('dup', prev)
    if again then return again end
  end
end

local fields, want = {}, {}
for i = sel0, #ARGV, 2 do
  fields[#fields + 1] = 'a:' .. ARGV[i]
  want[#want + 1] = ARGV[i + 1]
end
local function selected(name)
  if #fields == 0 then return true end
  local vs = redis.call('HMGET', mkey(name), unpack(fields))
  for i = 1, #want do
    if vs[i] ~= want[i] then return false end
  end
  return true
end
-- judge is pool.Store.judge: 0 eligible, 1 not selected, 2 unhealthy, 3 in
-- cooldown (with when it ends: the later of the target's and every
-- target's), 4 at capacity; the first matching reason counts.
local function judge(name)
  if not selected(name) then return 1 end
  local m = redis.call('HMGET', mkey(name), 'h', 'act')
  if m[1] ~= '1' then return 2 end
  local back = cooling(name, target)
  if back then return 3, back end
  if cap > 0 and tonumber(m[2]) >= cap then return 4 end
  return 0
end
local counts, first = {0, 0, 0, 0}, nil
local function count(v, back)
  if back and (not first or back < first) then first = back end
  if v == 1 then return end
  counts[1] = counts[1] + 1
  if v == 4 then counts[2] = counts[2] + 1 end
  if v == 3 then counts[3] = counts[3] + 1 end
  if v == 2 then counts[4] = counts[4] + 1 end
end

local chosen, walked = nil, false
if proxy ~= '' then
  if redis.call('SISMEMBER', MEMBERS, proxy) == 1 then
    local v, back = judge(proxy)
    if v == 0 then chosen = proxy else count(v, back) end
  end
else
  -- Walk sel in rotation.Less order; every member there is healthy and not
  -- resting for every target. Scores only grow along the walk, so the first
  -- member at capacity ends it. A selector walks its first pair's set
  -- instead: only members with that pair, the others checked as it goes.
  local walk = SEL
  if #fields > 0 then walk = B .. 'sp:' .. ARGV[sel0] .. '\2' .. ARGV[sel0 + 1] end
  local start, step, stop = 0, 4, false
  while not chosen and not stop do
    local batch = redis.call('ZRANGE', walk, start, start + step - 1, 'WITHSCORES')
    if #batch == 0 then break end
    for i = 1, #batch, 2 do
      if cap > 0 and tonumber(batch[i + 1]) >= cap then
        stop = true
        break
      end
      local name = string.sub(batch[i], 43)
      if (#fields < 2 or selected(name)) and not cooling(name, target) then
        chosen, walked = name, true
        break
      end
    end
    start = start + step
    step = 64
  end
  if not chosen then
    -- A refusal's counts are exact: judge every current member.
    for _, name in ipairs(redis.call('SMEMBERS', MEMBERS)) do count(judge(name)) end
  end
end
-- rotation.FailureRest's override: with nobody eligible, the member whose
-- only bar is a rest for its own failures, least recently failed first
-- (then in rotation.Less order: active leases, then its sel entry).
local override = '0'
if not chosen then
  local cands = {}
  if proxy ~= '' then
    if redis.call('SISMEMBER', MEMBERS, proxy) == 1 then cands = {proxy} end
  else
    cands = redis.call('ZRANGE', REST, 0, -1)
  end
  local bu, bact, bent
  for _, name in ipairs(cands) do
    local u, _, r = cool(name, '')
    if u and now < u and r == 'upstream_failed' and selected(name) then
      local m = redis.call('HMGET', mkey(name), 'h', 'act', 'ent')
      local act, site = tonumber(m[2]), false
      if target ~= '' then
        local x = cool(name, target)
        site = x and now < x
      end
      if m[1] == '1' and not site and (cap <= 0 or act < cap) and
          (not chosen or u < bu or (u == bu and (act < bact or (act == bact and m[3] < bent)))) then
        chosen, bu, bact, bent = name, u, act, m[3]
      end
    end
  end
  if chosen then override = '1' end
end
if not chosen then
  local wait = 0
  if first then wait = first - now end
  return {'nomatch', counts[1], counts[2], counts[3], counts[4], wait}
end

local k = mkey(chosen)
local m = redis.call('HMGET', k, 'ent', 'lat', 'act', 'def', 'gen', 'ap')
local seq = redis.call('INCR', B .. 'seq')
if seq == 1 then redis.call('PEXPIRE', B .. 'seq', LIFE) end
local act = tonumber(m[3]) + 1
local ent = entry(seq, tonumber(m[2]), chosen)
local ps = pairkeys(m[6])
redis.call('HSET', k, 'seq', seq, 'ent', ent, 'act', act)
-- A walked member is in sel; a pinned one may not be, and is placed.
if not idxmove(ps, m[1], act, ent, walked) then place(chosen) end
local exp = now + ttl
local lk = lkey(id)
redis.call('HSET', lk, 'm', chosen, 'g', m[5], 't', target, 'ttl', ttl, 'exp', exp, 'end', exp, 'rel', 0)
redis.call('PEXPIREAT', lk, exp + COOLMAX)
redis.call('ZADD', EXP, exp, id)
born(EXP)
if idem ~= '' then redis.call('SET', B .. 'i:' .. idem, id, 'PX', ttl) end
-- The TTL refresh is due at most once a minute; asking (a PTTL) on every
-- 64th choice is often enough for keys that live a day.
if seq % 64 == 0 then touch(false) end
return {'ok', id, chosen, m[4], target, ttl, exp, override}
`

// redisReleaseLua: ARGV[3] released leases kept reportable (see retain),
// [4..] lease ids. Returns how many leases it ended.
const redisReleaseLua = redisLuaPrelude + `
local n, keep = 0, tonumber(ARGV[3])
for i = 4, #ARGV do n = n + release(ARGV[i], keep) end
return n
`

// redisReportLua: ARGV[3] lease id, [4] result, [5] target, [6] failure
// window ms, [7] site-failure rest ms, [8] rotation.FailureRest's
// MaxPercent, [9..] ban windows by strike count
// (rotation.CooldownPolicy.Window for strikes 1, 2, ... up to the cap; the
// last one repeats). Returns "ok", "stale" (the member is gone or a new
// upstream: nothing changed) or "unknown".
const redisReportLua = redisLuaPrelude + `
local l = redis.call('HMGET', lkey(ARGV[3]), 'm', 'g', 't', 'end')
if not l[1] or now >= tonumber(l[4]) + COOLMAX then return 'unknown' end
local target = ARGV[5]
if target == '' then target = l[3] end
local name, res = l[1], ARGV[4]
if redis.call('HGET', mkey(name), 'gen') ~= l[2] then return 'stale' end
local function global(u)
  local m = redis.call('HMGET', mkey(name), 'ent', 'ap')
  if m[1] then idxrem(pairkeys(m[2]), m[1]) end
  place(name)
end
-- admit is rotation.FailureRest.Admit over the healthy members: when the
-- ones resting for their own failures are the share allowed, the least
-- recently failed comes back to make room for name.
local function admit()
  local pct, healthy, resting, oldest, ou = tonumber(ARGV[8]), 0, 0, nil, nil
  for _, n in ipairs(redis.call('SMEMBERS', MEMBERS)) do
    if redis.call('HGET', mkey(n), 'h') == '1' then
      healthy = healthy + 1
      local u, _, r = cool(n, '')
      if n ~= name and u and now < u and r == 'upstream_failed' then
        resting = resting + 1
        if not oldest or u < ou or (u == ou and n < oldest) then oldest, ou = n, u end
      end
    end
  end
  if oldest and resting * 100 >= pct * healthy then endrest(oldest) end
end
if res == 'ok' or res == 'answered' then
  if res == 'ok' then
    local u, _, r = cool(name, target)
    if u then setcool(name, target, u, 0, r) end
  end
  endrest(name)
elseif res == 'rate_limited' or res == 'banned' then
  local u, s, r = cool(name, target)
  if not u or now >= u + COOLMAX then u, s, r = 0, 0, '' end
  if now >= u or s == 0 then s = s + 1 end
  local nwin = #ARGV - 8
  local nu = now + tonumber(ARGV[8 + math.min(s, nwin)])
  local extended = nu > u
  if extended then u, r = nu, res end
  setcool(name, target, u, s, r)
  if extended and target == '' then global() end
elseif res == 'target_unreachable' then
  local u, s = cool(name, target)
  if not u then u, s = 0, 0 end
  local nu = now + tonumber(ARGV[7])
  if nu > u then
    setcool(name, target, nu, s, res)
    if target == '' then global() end
  end
elseif res == 'upstream_failed' then
  local u, s, r = cool(name, '')
  if not u then u, s, r = 0, 0, '' end
  local why = res
  if now < u and r ~= 'upstream_failed' then
    -- A ban or site rest for every target runs: the failure may lengthen
    -- it but does not make it a failure rest, which an answer would end.
    why = r
  elseif not (now < u) then
    admit()
  end
  local nu = now + tonumber(ARGV[6])
  if nu > u then
    setcool(name, '', nu, s, why)
    global()
  end
end
return 'ok'
`

// redisSetMembersLua: ARGV[3] "1" when health comes with the members, [4]
// JSON [{n, d, f, aj, a: [k, v, ...], h: "1"|"0", l: ns}]. Kept members
// keep their state unless the fingerprint (endpoint) changed; removed ones
// are forgotten, their leases still releasable and reportable.
const redisSetMembersLua = redisLuaPrelude + `
advance()
local withHealth = ARGV[3] == '1'
local list = cjson.decode(ARGV[4])
local keep = {}
for _, x in ipairs(list) do
  local n = x.n
  if not keep[n] then
    keep[n] = true
    local k = mkey(n)
    local cur = redis.call('HMGET', k, 'f', 'aj', 'ent', 'ap', 'act')
    local ap = {}
    for i = 1, #x.a, 2 do ap[#ap + 1] = x.a[i] .. '\2' .. x.a[i + 1] end
    ap = table.concat(ap, '\1')
    for _, pk in ipairs(pairkeys(ap)) do redis.call('SADD', B .. 'pairs', pk) end
    if cur[1] ~= x.f then
      if cur[3] then idxrem(pairkeys(cur[4]), cur[3]) end
      redis.call('ZREM', REST, n)
      redis.call('DEL', k, ckey(n))
      local gen = redis.call('INCR', B .. 'gen')
      redis.call('HSET', k, 'def', x.d, 'f', x.f, 'aj', x.aj, 'gen', gen, 'h', '1', 'lat', 0, 'seq', 0, 'act', 0, 'ent', entry(0, 0, n), 'ap', ap)
      for i = 1, #x.a, 2 do redis.call('HSET', k, 'a:' .. x.a[i], x.a[i + 1]) end
      redis.call('SADD', MEMBERS, n)
    else
      if cur[2] ~= x.aj then
        for key, _ in pairs(cjson.decode(cur[2])) do redis.call('HDEL', k, 'a:' .. key) end
        for i = 1, #x.a, 2 do redis.call('HSET', k, 'a:' .. x.a[i], x.a[i + 1]) end
      end
      if cur[4] ~= ap then
        -- Other pairs (or a member written before the pair sets): move
        -- its entry to the sets of its pairs now.
        local old = pairkeys(cur[4])
        for _, pk in ipairs(old) do redis.call('ZREM', pk, cur[3]) end
        if redis.call('ZSCORE', SEL, cur[3]) then
          for _, pk in ipairs(pairkeys(ap)) do
            redis.call('ZADD', pk, tonumber(cur[5]), cur[3])
            born(pk)
          end
        end
      end
      redis.call('HSET', k, 'def', x.d, 'aj', x.aj, 'ap', ap)
    end
    redis.call('PEXPIRE', k, LIFE)
    if withHealth then sethealth(n, x.h, x.l) end
    place(n)
  end
end
for _, n in ipairs(redis.call('SMEMBERS', MEMBERS)) do
  if not keep[n] then
    local m = redis.call('HMGET', mkey(n), 'ent', 'ap')
    if m[1] then idxrem(pairkeys(m[2]), m[1]) end
    redis.call('ZREM', REST, n)
    redis.call('DEL', mkey(n), ckey(n))
    redis.call('SREM', MEMBERS, n)
  end
end
touch(true)
return #list
`

// redisSetHealthLua: ARGV[3] name, [4] "1"|"0", [5] latency ns.
const redisSetHealthLua = redisLuaPrelude + `
if redis.call('SISMEMBER', MEMBERS, ARGV[3]) == 0 then return 0 end
advance()
sethealth(ARGV[3], ARGV[4], tonumber(ARGV[5]))
return 1
`

// redisAnsweredLua: ARGV[3] name. A passing probe: the member's rest for
// its own failures ends (pool.Store.Answered).
const redisAnsweredLua = redisLuaPrelude + `
if redis.call('SISMEMBER', MEMBERS, ARGV[3]) == 0 then return 0 end
advance()
endrest(ARGV[3])
return 1
`

// redisMembersLua returns {now, live leases, [name, def, h, lat, act,
// {target, until, reason, ...}] ...} for every current member, after advance.
const redisMembersLua = redisLuaPrelude + `
advance()
local out = {now, redis.call('ZCARD', EXP)}
for _, n in ipairs(redis.call('SMEMBERS', MEMBERS)) do
  local m = redis.call('HMGET', mkey(n), 'def', 'h', 'lat', 'act')
  if m[1] then
    local cs = {}
    local raw = redis.call('HGETALL', ckey(n))
    for i = 1, #raw, 2 do
      local u, _, r = parsecool(raw[i + 1])
      if now < u then
        cs[#cs + 1] = raw[i]
        cs[#cs + 1] = u
        cs[#cs + 1] = r
      end
    end
    out[#out + 1] = {n, m[1], m[2], tonumber(m[3]), tonumber(m[4]), cs}
  end
end
return out
`
