package statuspage

import "time"

// SitePace is one paced site as the gateway page shows it: its explicit
// pace, the pace the automatic slow-down learnt and why, and what pacing
// did to its requests. Only sites with a pace of some kind are listed.
type SitePace struct {
	Site string `json:"site"`
	// MinIntervalMillis and MaxConcurrency are the operator's pace (0:
	// none); LearntIntervalMillis the automatic slow-down's (0: unlimited).
	MinIntervalMillis    int64 `json:"minIntervalMillis"`
	MaxConcurrency       int   `json:"maxConcurrency"`
	LearntIntervalMillis int64 `json:"learntIntervalMillis"`
	// SlowedBy is the answer that made the last cut (rate_limited,
	// banned; "another gateway (the store's pace)" while this gateway
	// knows the cut only from the shared store's list), SlowedAt when,
	// Cuts how many since the site was unlimited.
	SlowedBy string    `json:"slowedBy,omitempty"`
	SlowedAt time.Time `json:"slowedAt,omitzero"`
	Cuts     int       `json:"cuts,omitempty"`
	// InFlight and Queued are now; Waited, WaitedSeconds and Refused count
	// since the gateway started (while the site is kept).
	InFlight      int     `json:"inFlight"`
	Queued        int     `json:"queued"`
	Waited        uint64  `json:"waited"`
	WaitedSeconds float64 `json:"waitedSeconds"`
	Refused       uint64  `json:"refused"`
	// Limit is the limit that held its last waiting or refused request.
	Limit string `json:"limit,omitempty"`
}
