package statuspage

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Defaults of TimelineOptions' zero values: the pages chart the last 15
// minutes in 30-second bars.
const (
	DefaultWindow = 15 * time.Minute
	DefaultBucket = 30 * time.Second
)

// maxOutcomes bounds the distinct outcomes a Timeline counts; later ones
// are counted as OutcomeOther. The gateway has about twenty (its answers'
// reasons), the lease API six.
const maxOutcomes = 32

// OutcomeOther collects outcomes past the first maxOutcomes.
const OutcomeOther = "other"

// TimelineOptions configures NewTimeline.
type TimelineOptions struct {
	// Window is how far back the chart reaches (DefaultWindow when zero).
	Window time.Duration
	// Bucket is one bar's width (DefaultBucket when zero; at least a second).
	Bucket time.Duration
	// Clock is the time source (the real clock when nil; tests step a
	// k8s.io/utils/clock/testing fake).
	Clock clock.PassiveClock
}

// Timeline counts outcomes (of gateway requests, of lease requests) in
// fixed time buckets over a window: the data of the status pages' chart.
// It is a ring of buckets, so its memory is fixed. Add runs on the
// gateway's request path: one clock read and one atomic add, with a lock
// only when a bucket is reused for a new period.
type Timeline struct {
	width   int64 // bucket width in ns
	clock   clock.PassiveClock
	buckets []tlBucket

	mu    sync.Mutex               // starting a bucket; adding an outcome name
	names atomic.Pointer[[]string] // outcome names by counter index, copy-on-write
}

type tlBucket struct {
	// period is the bucket number (unix ns / width) the counts are for.
	period atomic.Int64
	counts [maxOutcomes]atomic.Int64
}

// NewTimeline returns an empty timeline.
func NewTimeline(o TimelineOptions) *Timeline {
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.Bucket <= 0 {
		o.Bucket = DefaultBucket
	}
	o.Bucket = max(o.Bucket, time.Second) // Chart speaks in whole seconds
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	n := max(int((o.Window+o.Bucket-1)/o.Bucket), 1)
	t := &Timeline{width: int64(o.Bucket), clock: o.Clock, buckets: make([]tlBucket, n)}
	for i := range t.buckets {
		t.buckets[i].period.Store(-1)
	}
	t.names.Store(&[]string{})
	return t
}

// Add counts one outcome now. It is safe for concurrent use.
func (t *Timeline) Add(outcome string) {
	i := t.index(outcome)
	p := t.clock.Now().UnixNano() / t.width
	b := &t.buckets[int(p%int64(len(t.buckets)))]
	if cur := b.period.Load(); cur != p {
		if cur > p {
			// A clock read from before the bucket was reused: the
			// period it belongs to is no longer kept.
			return
		}
		t.start(b, p)
	}
	b.counts[i].Add(1)
}

// start resets b for period p unless another Add already did.
func (t *Timeline) start(b *tlBucket, p int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b.period.Load() >= p {
		return
	}
	for i := range b.counts {
		b.counts[i].Store(0)
	}
	b.period.Store(p)
}

// index is outcome's counter, added on first sight.
func (t *Timeline) index(outcome string) int {
	names := *t.names.Load()
	if i := slices.Index(names, outcome); i >= 0 {
		return i
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	names = *t.names.Load()
	if i := slices.Index(names, outcome); i >= 0 {
		return i
	}
	// The last counter is kept for OutcomeOther, so there always is one.
	if len(names) >= maxOutcomes-1 && outcome != OutcomeOther {
		outcome = OutcomeOther
		if i := slices.Index(names, outcome); i >= 0 {
			return i
		}
	}
	next := append(slices.Clone(names), outcome)
	t.names.Store(&next)
	return len(next) - 1
}

// Chart is a timeline's counts, oldest bar first; the last bar is the
// period now running.
type Chart struct {
	// BucketSeconds is one bar's width.
	BucketSeconds int `json:"bucketSeconds"`
	// Start is when the first bar begins.
	Start time.Time `json:"start"`
	// Bars is the number of bars; every series has that many counts.
	Bars int `json:"bars"`
	// Series has one entry per outcome seen in the window: "ok" first,
	// then by name.
	Series []Series `json:"series"`
	// Total counts everything in the window.
	Total int64 `json:"total"`
}

// Series is one outcome's counts per bar.
type Series struct {
	Outcome string  `json:"outcome"`
	Counts  []int64 `json:"counts"`
	Total   int64   `json:"total"`
}

// Chart reads the window ending now.
func (t *Timeline) Chart() Chart {
	n := len(t.buckets)
	last := t.clock.Now().UnixNano() / t.width
	first := last - int64(n) + 1
	names := *t.names.Load()
	c := Chart{BucketSeconds: int(t.width / int64(time.Second)), Start: time.Unix(0, first*t.width).UTC(), Bars: n, Series: []Series{}}
	for oi, name := range names {
		s := Series{Outcome: name, Counts: make([]int64, n)}
		for i := range n {
			p := first + int64(i)
			b := &t.buckets[int(p%int64(n))]
			if b.period.Load() == p {
				s.Counts[i] = b.counts[oi].Load()
				s.Total += s.Counts[i]
			}
		}
		if s.Total > 0 {
			c.Series = append(c.Series, s)
			c.Total += s.Total
		}
	}
	slices.SortFunc(c.Series, func(a, b Series) int {
		switch {
		case a.Outcome == b.Outcome:
			return 0
		case a.Outcome == "ok":
			return -1
		case b.Outcome == "ok":
			return 1
		case a.Outcome < b.Outcome:
			return -1
		}
		return 1
	})
	return c
}
