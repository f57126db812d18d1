package leaseapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// A site's place on the tiers over the lease API (POST /v1/tier): the
// server's lease store decides, so gateways on --lease-api start a site
// where the fleet learnt to. Each call is one pool.SiteTierKeeper decision;
// the caller sends its own rule, as it would to a store of its own.

// tierRequest is the body of POST /v1/tier; op says which decision.
type tierRequest struct {
	Op   string `json:"op"` // start, answer
	Site string `json:"site"`
	// Lo and Hi are the tiers the request may use (start); Top the
	// caller's costliest tier (both ops).
	Lo  int `json:"lo,omitempty"`
	Hi  int `json:"hi,omitempty"`
	Top int `json:"top"`
	// Level is the tier that carried the answer, SeenMoves the moves the
	// request started under, Result the answer (answer).
	Level     int      `json:"level,omitempty"`
	SeenMoves int      `json:"seenMoves,omitempty"`
	Result    string   `json:"result,omitempty"`
	Rule      tierRule `json:"rule"`
}

// tierRule is a rotation.TierRule on the wire.
type tierRule struct {
	Threshold    int   `json:"threshold"`
	WindowMs     int64 `json:"windowMillis"`
	HoldMs       int64 `json:"holdMillis"`
	ProbeEveryMs int64 `json:"probeEveryMillis"`
}

func toTierRule(r rotation.TierRule) tierRule {
	return tierRule{Threshold: r.Threshold, WindowMs: r.Window.Milliseconds(), HoldMs: r.Hold.Milliseconds(), ProbeEveryMs: r.ProbeEvery.Milliseconds()}
}

func (w tierRule) rule() rotation.TierRule {
	return rotation.TierRule{Threshold: w.Threshold, Window: time.Duration(w.WindowMs) * time.Millisecond,
		Hold: time.Duration(w.HoldMs) * time.Millisecond, ProbeEvery: time.Duration(w.ProbeEveryMs) * time.Millisecond}
}

// tierAnswer is the body of a POST /v1/tier answer: start's decision, and
// the site's place after the call.
type tierAnswer struct {
	Level int       `json:"level"`
	Probe bool      `json:"probe,omitempty"`
	Moves int       `json:"moves"`
	Place placeWire `json:"place"`
}

// placeWire is a rotation.SiteTier on the wire.
type placeWire struct {
	Level     int       `json:"level"`
	Since     time.Time `json:"since,omitzero"`
	Bans      int       `json:"bans,omitempty"`
	BansFrom  time.Time `json:"bansFrom,omitzero"`
	Climbs    int       `json:"climbs,omitempty"`
	LastProbe time.Time `json:"lastProbe,omitzero"`
	Down      bool      `json:"down,omitempty"`
	Moves     int       `json:"moves,omitempty"`
}

func toPlaceWire(p rotation.SiteTier) placeWire {
	return placeWire{Level: p.Level, Since: p.Since, Bans: p.Bans, BansFrom: p.BansFrom, Climbs: p.Climbs, LastProbe: p.LastProbe, Down: p.Down, Moves: p.Moves}
}

func (w placeWire) place() rotation.SiteTier {
	return rotation.SiteTier{Level: w.Level, Since: w.Since, Bans: w.Bans, BansFrom: w.BansFrom, Climbs: w.Climbs, LastProbe: w.LastProbe, Down: w.Down, Moves: w.Moves}
}

// maxTierTop bounds the tiers a caller may name (rotation.ParseTiers
// allows 16).
const maxTierTop = 15

// checkTier is what every op needs; a bad request is a sentence naming the
// field. It puts the site in its key form, as checkPace does.
func checkTier(b *tierRequest) error {
	if b.Op != "start" && b.Op != "answer" {
		return fmt.Errorf("op %q: want start or answer", b.Op)
	}
	site, err := rotation.ParseTarget(b.Site)
	switch {
	case b.Site == "":
		return errors.New("site must be a host (the request's target)")
	case err != nil:
		return fmt.Errorf("site %q %s", b.Site, err)
	case b.Top < 1 || b.Top > maxTierTop:
		return fmt.Errorf("top %d is out of range (1 to %d: the caller's costliest tier, of two or more)", b.Top, maxTierTop)
	case b.Op == "start" && (b.Lo < 0 || b.Hi < b.Lo || b.Hi > b.Top):
		return fmt.Errorf("lo %d and hi %d are not a range of tiers 0 to top %d", b.Lo, b.Hi, b.Top)
	case b.Op == "answer" && b.Result == "":
		return errors.New("op answer needs result")
	}
	if err := b.Rule.rule().Check(); err != nil {
		return fmt.Errorf("rule: %w", err)
	}
	b.Site = site
	return nil
}

func (s *apiServer) tier(w http.ResponseWriter, r *http.Request) {
	if s.tiers == nil {
		writeError(w, http.StatusNotFound, apiErrNotFound, "this lease API keeps no tiers of sites")
		return
	}
	var b tierRequest
	if !s.decodeBody(w, r, &b, false) {
		return
	}
	if err := checkTier(&b); err != nil {
		writeError(w, http.StatusBadRequest, apiErrBadRequest, err.Error())
		return
	}
	ctx := r.Context()
	rule := b.Rule.rule()
	var out tierAnswer
	switch b.Op {
	case "start":
		st, err := s.tiers.StartTier(ctx, b.Site, rotation.TierRange{Lo: b.Lo, Hi: b.Hi}, rule)
		if err != nil {
			s.backendFailed(w, "tier start", err)
			return
		}
		out = tierAnswer{Level: st.Level, Probe: st.Probe, Moves: st.Moves}
	case "answer":
		res, err := rotation.ParseResult(b.Result)
		if err != nil {
			writeError(w, http.StatusBadRequest, apiErrInvalidResult, err.Error())
			return
		}
		a := pool.TierAnswer{Site: b.Site, Level: b.Level, SeenMoves: b.SeenMoves, Result: res, Rule: rule, Top: b.Top}
		if err := a.Check(); err != nil {
			writeError(w, http.StatusBadRequest, apiErrBadRequest, err.Error())
			return
		}
		p, err := s.tiers.TierAnswered(ctx, a)
		if err != nil {
			s.backendFailed(w, "tier answer", err)
			return
		}
		out = tierAnswer{Level: p.Level, Moves: p.Moves, Place: toPlaceWire(p)}
	}
	writeJSON(w, http.StatusOK, out)
}

// tier is one POST /v1/tier.
func (c *Client) tier(ctx context.Context, b tierRequest) (tierAnswer, error) {
	return decide[tierAnswer](ctx, c, "/v1/tier", "tier", b)
}

// StartTier is pool.SiteTierKeeper.StartTier. The caller's costliest tier
// goes as rg.Hi when it may use every tier; a narrower range is the
// caller's own, within the same top.
func (c *Client) StartTier(ctx context.Context, site string, rg rotation.TierRange, rule rotation.TierRule) (pool.TierStart, error) {
	a, err := c.tier(ctx, tierRequest{Op: "start", Site: site, Lo: rg.Lo, Hi: rg.Hi, Top: max(rg.Hi, 1), Rule: toTierRule(rule)})
	return pool.TierStart{Level: a.Level, Probe: a.Probe, Moves: a.Moves}, err
}

// TierAnswered is pool.SiteTierKeeper.TierAnswered.
func (c *Client) TierAnswered(ctx context.Context, a pool.TierAnswer) (rotation.SiteTier, error) {
	out, err := c.tier(ctx, tierRequest{Op: "answer", Site: a.Site, Level: a.Level, SeenMoves: a.SeenMoves, Result: string(a.Result), Top: a.Top, Rule: toTierRule(a.Rule)})
	return out.Place.place(), err
}
