package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// redisRecentBansLua: ARGV[3] the window in ms. It returns {member,
// target, until, reason, ...} for every ban or rate-limit cooldown of a
// current member for one site whose window ended at or after now - window
// on the server's clock. It only reads: no advance, no TTL refresh.
const redisRecentBansLua = redisLuaPrelude + `
local since = now - tonumber(ARGV[3])
local out = {}
for _, n in ipairs(redis.call('SMEMBERS', MEMBERS)) do
  local raw = redis.call('HGETALL', ckey(n))
  for i = 1, #raw, 2 do
    local u, _, r = parsecool(raw[i + 1])
    if raw[i] ~= '' and (r == 'banned' or r == 'rate_limited') and u >= since then
      out[#out + 1] = n
      out[#out + 1] = raw[i]
      out[#out + 1] = u
      out[#out + 1] = r
    end
  end
end
return out
`

var recentBansScript = redis.NewScript(redisRecentBansLua)

// RecentBans is pool.Store.RecentBans on the shared store, read in one
// script per member group on the server's clock: the window's start is the
// server's now minus window, as every cooldown's end is the server's. An
// ended window is remembered as long as its cooldown hash lives
// (Cooldown.Max after the member's last window ends).
func (s *RedisStore) RecentBans(ctx context.Context, window time.Duration) ([]pool.Cooldown, error) {
	var res []any
	for _, keys := range s.shards {
		part, err := s.runIn(ctx, "recent_bans", keys, recentBansScript, s.args(max(window, 0).Milliseconds())...).Slice()
		if err != nil {
			return nil, s.wrap("recent bans", err)
		}
		if len(part)%4 != 0 {
			return nil, fmt.Errorf("lease store: recent bans: malformed reply")
		}
		res = append(res, part...)
	}
	out := make([]pool.Cooldown, 0, len(res)/4)
	for i := 0; i < len(res); i += 4 {
		out = append(out, pool.Cooldown{
			Member: toString(res[i]), Target: toString(res[i+1]),
			Until: time.UnixMilli(int64(toInt(res[i+2]))), Reason: rotation.Result(toString(res[i+3])),
		})
	}
	pool.SortCooldowns(out)
	return out, nil
}
