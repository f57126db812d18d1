package leaseapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/rotation"
)

// The pace of sites over the lease API (POST /v1/pace, GET /v1/pace/slowed):
// the server's lease store decides, so gateways on --lease-api pace a site
// with the fleet. Each call is one pool.SitePacer decision.

// maxPaceMillis bounds the durations of a pace request (a day).
const maxPaceMillis = 24 * 60 * 60 * 1000

// paceRequest is the body of POST /v1/pace; op says which decision.
type paceRequest struct {
	Op            string `json:"op"` // reserve, return, enter, leave, answer
	Site          string `json:"site"`
	Member        string `json:"member,omitempty"`
	MinIntervalMs int64  `json:"minIntervalMillis,omitempty"`
	Auto          bool   `json:"auto,omitempty"`
	MaxWaitMs     int64  `json:"maxWaitMillis,omitempty"`
	Token         int64  `json:"token,omitempty"`
	Holder        string `json:"holder,omitempty"`
	Limit         int    `json:"limit,omitempty"`
	Result        string `json:"result,omitempty"`
	SeenCuts      int    `json:"seenCuts,omitempty"`
	// FirstCut is what a ban sets when the site is not slowed (the
	// gateway's rotation.PaceRule.FirstCut); absent: the fixed first cut.
	// On a slowed site its pause is the least a later cut pauses for.
	FirstCut *cutWire `json:"firstCut,omitempty"`
}

// cutWire is a rotation.Cut on the wire.
type cutWire struct {
	IntervalNs int64 `json:"intervalNanos,omitempty"`
	PauseNs    int64 `json:"pauseNanos,omitempty"`
	FloorNs    int64 `json:"floorNanos,omitempty"`
	Steps      int   `json:"steps,omitempty"`
	MemoryNs   int64 `json:"memoryNanos,omitempty"`
}

func toCutWire(c rotation.Cut) *cutWire {
	if c == (rotation.Cut{}) {
		return nil
	}
	return &cutWire{IntervalNs: int64(c.Interval), PauseNs: int64(c.Pause), FloorNs: int64(c.Floor), Steps: c.Steps, MemoryNs: int64(c.Memory)}
}

// cut is w as a rotation.Cut, or an error naming the field out of range.
func (w *cutWire) cut() (rotation.Cut, error) {
	if w == nil {
		return rotation.Cut{}, nil
	}
	c := rotation.Cut{Interval: time.Duration(w.IntervalNs), Pause: time.Duration(w.PauseNs), Floor: time.Duration(w.FloorNs), Steps: w.Steps, Memory: time.Duration(w.MemoryNs)}
	switch {
	case c.Interval < 0 || c.Interval > rotation.PaceMaxInterval:
		return c, fmt.Errorf("firstCut.intervalNanos %d is out of range (0 to %d)", w.IntervalNs, int64(rotation.PaceMaxInterval))
	case c.Floor < 0 || c.Floor > rotation.PaceMaxInterval:
		return c, fmt.Errorf("firstCut.floorNanos %d is out of range (0 to %d)", w.FloorNs, int64(rotation.PaceMaxInterval))
	case c.Pause < 0 || c.Pause > 2*rotation.MaxPaceWindow:
		return c, fmt.Errorf("firstCut.pauseNanos %d is out of range (0 to %d)", w.PauseNs, int64(2*rotation.MaxPaceWindow))
	case c.Steps < 0 || c.Steps > rotation.MaxPaceIncreaseSteps:
		return c, fmt.Errorf("firstCut.steps %d is out of range (0 to %d)", w.Steps, rotation.MaxPaceIncreaseSteps)
	case c.Memory < 0 || c.Memory > rotation.MaxPaceMemory:
		return c, fmt.Errorf("firstCut.memoryNanos %d is out of range (0 to %d)", w.MemoryNs, int64(rotation.MaxPaceMemory))
	}
	return c, nil
}

// learntWire is a rotation.LearntPace on the wire.
type learntWire struct {
	IntervalNs    int64     `json:"intervalNanos,omitempty"`
	CutIntervalNs int64     `json:"cutIntervalNanos,omitempty"`
	Cause         string    `json:"cause,omitempty"`
	CutAt         time.Time `json:"cutAt,omitzero"`
	Cuts          int       `json:"cuts,omitempty"`
	PauseNs       int64     `json:"pauseNanos,omitempty"`
	FloorNs       int64     `json:"floorNanos,omitempty"`
	Steps         int       `json:"steps,omitempty"`
	MemoryNs      int64     `json:"memoryNanos,omitempty"`
	Faded         int       `json:"faded,omitempty"`
}

func toLearntWire(l rotation.LearntPace) learntWire {
	return learntWire{IntervalNs: int64(l.Interval), CutIntervalNs: int64(l.CutInterval), Cause: string(l.Cause), CutAt: l.CutAt, Cuts: l.Cuts,
		PauseNs: int64(l.Pause), FloorNs: int64(l.Floor), Steps: l.Steps, MemoryNs: int64(l.Memory), Faded: l.Faded}
}

func (w learntWire) learnt() rotation.LearntPace {
	return rotation.LearntPace{Interval: time.Duration(w.IntervalNs), CutInterval: time.Duration(w.CutIntervalNs), Cause: rotation.Result(w.Cause), CutAt: w.CutAt, Cuts: w.Cuts,
		Pause: time.Duration(w.PauseNs), Floor: time.Duration(w.FloorNs), Steps: w.Steps, Memory: time.Duration(w.MemoryNs), Faded: w.Faded}
}

// paceAnswer is the body of a POST /v1/pace answer.
type paceAnswer struct {
	Reserved   bool       `json:"reserved,omitempty"`
	WaitNs     int64      `json:"waitNanos,omitempty"`
	IntervalNs int64      `json:"intervalNanos,omitempty"`
	Token      int64      `json:"token,omitempty"`
	In         bool       `json:"in,omitempty"`
	Learnt     learntWire `json:"learnt"`
}

// slowedList is the body of GET /v1/pace/slowed.
type slowedList struct {
	Sites []string `json:"sites"`
}

// checkPace is what every op needs; a bad request is a sentence naming
// the field. It puts the site in its key form (as the gateway sends it),
// so Example.COM and example.com are one site's pace.
func checkPace(b *paceRequest) error {
	need := map[string][]string{"reserve": {"member"}, "return": {"member"}, "enter": {"holder"}, "leave": {"holder"}, "answer": {"member", "result"}}
	fields, ok := need[b.Op]
	if !ok {
		return fmt.Errorf("op %q: want reserve, return, enter, leave or answer", b.Op)
	}
	site, err := rotation.ParseTarget(b.Site)
	switch {
	case b.Site == "":
		return errors.New("site must be a host (the request's target)")
	case err != nil:
		return fmt.Errorf("site %q %s", b.Site, err)
	case b.MinIntervalMs < 0 || b.MinIntervalMs > maxPaceMillis:
		return fmt.Errorf("minIntervalMillis %d is out of range (0 to a day)", b.MinIntervalMs)
	case b.MaxWaitMs < 0 || b.MaxWaitMs > maxPaceMillis:
		return fmt.Errorf("maxWaitMillis %d is out of range (0 to a day)", b.MaxWaitMs)
	case b.Limit < 0:
		return fmt.Errorf("limit %d must not be negative", b.Limit)
	}
	b.Site = site
	for _, f := range fields {
		if (f == "member" && b.Member == "") || (f == "holder" && b.Holder == "") || (f == "result" && b.Result == "") {
			return fmt.Errorf("op %s needs %s", b.Op, f)
		}
	}
	return nil
}

// sitePacer is the server's pace, or an answer saying it keeps none.
func (s *apiServer) sitePacer(w http.ResponseWriter) (pool.SitePacer, bool) {
	if s.pacer == nil {
		writeError(w, http.StatusNotFound, apiErrNotFound, "this lease API keeps no pace of sites")
		return nil, false
	}
	return s.pacer, true
}

func (s *apiServer) pace(w http.ResponseWriter, r *http.Request) {
	p, ok := s.sitePacer(w)
	if !ok {
		return
	}
	var b paceRequest
	if !s.decodeBody(w, r, &b, false) {
		return
	}
	if err := checkPace(&b); err != nil {
		writeError(w, http.StatusBadRequest, apiErrBadRequest, err.Error())
		return
	}
	ctx := r.Context()
	var out paceAnswer
	var err error
	switch b.Op {
	case "reserve":
		var sl pool.Slot
		sl, err = p.ReserveSlot(ctx, pool.SlotRequest{Site: b.Site, Member: b.Member, Auto: b.Auto,
			MinInterval: time.Duration(b.MinIntervalMs) * time.Millisecond, MaxWait: time.Duration(b.MaxWaitMs) * time.Millisecond})
		out = paceAnswer{Reserved: sl.Reserved, WaitNs: int64(sl.Wait), IntervalNs: int64(sl.Interval), Token: sl.Token, Learnt: toLearntWire(sl.Learnt)}
	case "return":
		err = p.ReturnSlot(ctx, b.Site, b.Member, b.Token)
	case "enter":
		out.In, err = p.EnterSite(ctx, b.Site, b.Holder, b.Limit)
	case "leave":
		err = p.LeaveSite(ctx, b.Site, b.Holder)
	case "answer":
		res, perr := rotation.ParseResult(b.Result)
		if perr != nil {
			writeError(w, http.StatusBadRequest, apiErrInvalidResult, perr.Error())
			return
		}
		fc, cerr := b.FirstCut.cut()
		if cerr != nil {
			writeError(w, http.StatusBadRequest, apiErrBadRequest, cerr.Error())
			return
		}
		var l rotation.LearntPace
		l, err = p.SiteAnswered(ctx, pool.SiteAnswer{Site: b.Site, Member: b.Member, Result: res, SeenCuts: b.SeenCuts, FirstCut: fc})
		out.Learnt = toLearntWire(l)
	}
	if err != nil {
		s.backendFailed(w, "pace "+b.Op, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *apiServer) slowedSites(w http.ResponseWriter, r *http.Request) {
	p, ok := s.sitePacer(w)
	if !ok {
		return
	}
	sites, err := p.SlowedSites(r.Context())
	if err != nil {
		s.backendFailed(w, "slowed sites", err)
		return
	}
	writeJSON(w, http.StatusOK, slowedList{Sites: append([]string{}, sites...)})
}

// pace is one POST /v1/pace.
func (c *Client) pace(ctx context.Context, b paceRequest) (paceAnswer, error) {
	return decide[paceAnswer](ctx, c, "/v1/pace", "pace", b)
}

// decide is one POST of a store decision (/v1/pace, /v1/tier) and its
// answer: a status other than 200 is the API's error, an answer that does
// not read is one naming what.
func decide[T any](ctx context.Context, c *Client, path, what string, body any) (T, error) {
	var out T
	status, raw, err := c.do(ctx, http.MethodPost, path, body)
	if err != nil {
		return out, err
	}
	if status != http.StatusOK {
		return out, apiError(status, raw)
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("lease API: %s: malformed answer: %w", what, err)
	}
	return out, nil
}

// ceilMillis is d in whole ms, rounded up so no interval gets shorter.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// ReserveSlot is pool.SitePacer.ReserveSlot, decided by the server's store.
func (c *Client) ReserveSlot(ctx context.Context, req pool.SlotRequest) (pool.Slot, error) {
	a, err := c.pace(ctx, paceRequest{Op: "reserve", Site: req.Site, Member: req.Member, Auto: req.Auto,
		MinIntervalMs: ceilMillis(req.MinInterval), MaxWaitMs: max(req.MaxWait, 0).Milliseconds()})
	if err != nil {
		return pool.Slot{}, err
	}
	return pool.Slot{Reserved: a.Reserved, Wait: time.Duration(a.WaitNs), Interval: max(time.Duration(a.IntervalNs), req.MinInterval), Token: a.Token, Learnt: a.Learnt.learnt()}, nil
}

// ReturnSlot is pool.SitePacer.ReturnSlot.
func (c *Client) ReturnSlot(ctx context.Context, site, member string, token int64) error {
	_, err := c.pace(ctx, paceRequest{Op: "return", Site: site, Member: member, Token: token})
	return err
}

// EnterSite is pool.SitePacer.EnterSite.
func (c *Client) EnterSite(ctx context.Context, site, holder string, limit int) (bool, error) {
	a, err := c.pace(ctx, paceRequest{Op: "enter", Site: site, Holder: holder, Limit: limit})
	return a.In, err
}

// LeaveSite is pool.SitePacer.LeaveSite.
func (c *Client) LeaveSite(ctx context.Context, site, holder string) error {
	_, err := c.pace(ctx, paceRequest{Op: "leave", Site: site, Holder: holder})
	return err
}

// SiteAnswered is pool.SitePacer.SiteAnswered.
func (c *Client) SiteAnswered(ctx context.Context, a pool.SiteAnswer) (rotation.LearntPace, error) {
	out, err := c.pace(ctx, paceRequest{Op: "answer", Site: a.Site, Member: a.Member, Result: string(a.Result), SeenCuts: a.SeenCuts, FirstCut: toCutWire(a.FirstCut)})
	return out.Learnt.learnt(), err
}

// SlowedSites is pool.SitePacer.SlowedSites (GET /v1/pace/slowed).
func (c *Client) SlowedSites(ctx context.Context) ([]string, error) {
	status, raw, err := c.do(ctx, http.MethodGet, "/v1/pace/slowed", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, apiError(status, raw)
	}
	var out slowedList
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("lease API: slowed sites: malformed answer: %w", err)
	}
	return out.Sites, nil
}
