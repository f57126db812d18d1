package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

var (
	redisPace    = redis.NewScript(redisPaceLua)
	redisSlowed  = redis.NewScript(redisSlowedLua)
	paceQuietArg = rotation.PaceQuiet.Microseconds()
)

// maxPacedIndex bounds the index of slowed sites: past it, the sites
// remembered the shortest leave it (their paces end by their keys' TTL).
const maxPacedIndex = 10_000

// paceKeys is KEYS for the pace script of site: the site's own hash tag
// under the prefix, so that sites spread over a Cluster's slots. A site
// holding a brace (no host name does) is hashed so it cannot end the tag.
func (s *RedisStore) paceKeys(site string) []string {
	if strings.ContainsAny(site, "{}") {
		sum := sha256.Sum256([]byte(site))
		site = "#" + hex.EncodeToString(sum[:16])
	}
	return []string{"{" + s.prefix + ":p:" + site + "}:"}
}

// pacedKey is the index of slowed sites, on the pool's own slot.
func (s *RedisStore) pacedKey() string { return s.keys[0] + "paced" }

// runPace is one pace script call for site.
func (s *RedisStore) runPace(ctx context.Context, op, site string, argv ...any) *redis.Cmd {
	var cmd *redis.Cmd
	keys := s.paceKeys(site)
	argv = append([]any{op, paceQuietArg, rotation.PaceUnlimitedInterval.Nanoseconds()}, argv...)
	_ = s.do(ctx, "pace_"+op, func(ctx context.Context) error {
		cmd = redisPace.Run(ctx, s.rdb, keys, argv...)
		return cmd.Err()
	})
	return cmd
}

// ReserveSlot is pool.SitePacer.ReserveSlot as one script on the site's
// keys. Pace writes do not wait for a replica: a failover that loses the
// last slots lets at most one request per member go early.
func (s *RedisStore) ReserveSlot(ctx context.Context, req pool.SlotRequest) (pool.Slot, error) {
	auto := "0"
	if req.Auto {
		auto = "1"
	}
	res, err := s.runPace(ctx, "reserve", req.Site, req.Member, ceilMicros(req.MinInterval), auto, max(req.MaxWait, 0).Microseconds()).Slice()
	if err != nil {
		return pool.Slot{}, s.wrap("pace", err)
	}
	if len(res) != 5 {
		return pool.Slot{}, fmt.Errorf("lease store: pace: malformed reply %v", res)
	}
	l, err := parseLearnt(toString(res[3]))
	if err != nil {
		return pool.Slot{}, err
	}
	if toInt(res[4]) == 1 {
		s.unindexPace(ctx, req.Site)
	}
	out := pool.Slot{Learnt: l, Interval: max(req.MinInterval, l.Interval)}
	if out.Interval <= 0 {
		return out, nil
	}
	out.Wait = time.Duration(toInt(res[1])) * time.Microsecond
	out.Reserved = toInt(res[0]) == 1
	out.Token = int64(toInt(res[2]))
	return out, nil
}

// ceilMicros is d in whole µs, rounded up so no interval gets shorter.
func ceilMicros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// ReturnSlot is pool.SitePacer.ReturnSlot.
func (s *RedisStore) ReturnSlot(ctx context.Context, site, member string, token int64) error {
	if err := s.runPace(ctx, "return", site, member, strconv.FormatInt(token, 10)).Err(); err != nil {
		return s.wrap("pace", err)
	}
	return nil
}

// EnterSite is pool.SitePacer.EnterSite: a place is a member of the
// site's in-flight set until it leaves or pool.PaceHold passes.
func (s *RedisStore) EnterSite(ctx context.Context, site, holder string, limit int) (bool, error) {
	n, err := s.runPace(ctx, "enter", site, holder, max(limit, 0), pool.PaceHold.Microseconds()).Int()
	if err != nil {
		return false, s.wrap("pace", err)
	}
	return n == 1, nil
}

// LeaveSite is pool.SitePacer.LeaveSite.
func (s *RedisStore) LeaveSite(ctx context.Context, site, holder string) error {
	if err := s.runPace(ctx, "leave", site, holder).Err(); err != nil {
		return s.wrap("pace", err)
	}
	return nil
}

// SiteAnswered is pool.SitePacer.SiteAnswered: rotation.LearntPace's AIMD
// in the script, its constants passed from rotation so they have one
// definition. A cut also enters the site in the index of slowed sites
// (on the pool's slot, so a second call).
func (s *RedisStore) SiteAnswered(ctx context.Context, a pool.SiteAnswer) (rotation.LearntPace, error) {
	if _, err := rotation.ParseResult(string(a.Result)); err != nil {
		return rotation.LearntPace{}, fmt.Errorf("%w: %v", pool.ErrInvalidResult, err)
	}
	fc := a.FirstCut
	res, err := s.runPace(ctx, "answer", a.Site, a.Member, string(a.Result), a.SeenCuts,
		fc.Interval.Nanoseconds(), rotation.PaceFirstCut.Nanoseconds(), rotation.PaceMaxInterval.Nanoseconds(), rotation.PaceIncreaseSteps,
		fc.Pause.Nanoseconds(), fc.Floor.Nanoseconds(), fc.Steps, fc.Memory.Nanoseconds()).Slice()
	if err != nil {
		return rotation.LearntPace{}, s.wrap("pace", err)
	}
	if len(res) != 3 {
		return rotation.LearntPace{}, fmt.Errorf("lease store: pace: malformed reply %v", res)
	}
	l, err := parseLearnt(toString(res[0]))
	if err != nil {
		return rotation.LearntPace{}, err
	}
	switch toInt(res[1]) {
	case 1:
		k := s.pacedKey()
		err := s.do(ctx, "pace_index", func(ctx context.Context) error {
			_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.ZAdd(ctx, k, redis.Z{Score: float64(toInt(res[2])), Member: a.Site})
				p.PExpire(ctx, k, s.life)
				return nil
			})
			return err
		})
		if err != nil {
			return l, s.wrap("pace", err)
		}
	case -1:
		s.unindexPace(ctx, a.Site)
	}
	return l, nil
}

// unindexPace drops a site that is unlimited again from the index; a
// failure only leaves gateways asking about it until the index drops it
// by age.
func (s *RedisStore) unindexPace(ctx context.Context, site string) {
	_ = s.do(ctx, "pace_index", func(ctx context.Context) error { return s.rdb.ZRem(ctx, s.pacedKey(), site).Err() })
}

// SlowedSites is pool.SitePacer.SlowedSites: the index, less the sites
// whose learnt pace has ended (by the time each is remembered until).
func (s *RedisStore) SlowedSites(ctx context.Context) ([]string, error) {
	var out []string
	err := s.do(ctx, "pace_slowed", func(ctx context.Context) error {
		var err error
		out, err = redisSlowed.Run(ctx, s.rdb, []string{s.pacedKey()}, maxPacedIndex).StringSlice()
		return err
	})
	if err != nil {
		return nil, s.wrap("pace", err)
	}
	return out, nil
}

// parseLearnt reads the script's encoding of a learnt pace ("" is none).
func parseLearnt(v string) (rotation.LearntPace, error) {
	if v == "" {
		return rotation.LearntPace{}, nil
	}
	f := strings.Split(v, ":")
	if len(f) != 5 && len(f) != 10 {
		return rotation.LearntPace{}, fmt.Errorf("lease store: pace: malformed learnt pace %q", v)
	}
	var n [9]int64
	for i, j := range []int{0, 1, 3, 4, 5, 6, 7, 8, 9} {
		if j >= len(f) {
			break // the fixed rule's pace, written before the rule's fields were
		}
		x, err := strconv.ParseInt(f[j], 10, 64)
		if err != nil {
			return rotation.LearntPace{}, fmt.Errorf("lease store: pace: malformed learnt pace %q", v)
		}
		n[i] = x
	}
	return rotation.LearntPace{Interval: time.Duration(n[0]), CutInterval: time.Duration(n[1]), Cause: rotation.Result(f[2]), CutAt: time.UnixMicro(n[2]), Cuts: int(n[3]),
		Pause: time.Duration(n[4]), Floor: time.Duration(n[5]), Steps: int(n[6]), Memory: time.Duration(n[7]), Faded: int(n[8])}, nil
}
