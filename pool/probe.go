package pool

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/probe"
)

// Defaults of ProberOptions' zero values.
const (
	DefaultProbeInterval         = 10 * time.Second
	DefaultProbeTimeout          = 5 * time.Second
	DefaultProbeSuccessThreshold = 1
	DefaultProbeFailureThreshold = 3
	DefaultProbeConcurrency      = 16
)

// HealthSink receives probe verdicts; *Store implements it.
type HealthSink interface {
	SetHealth(name string, healthy bool, latency time.Duration)
}

// AnswerSink is a HealthSink that also hears of every passing probe, not
// only the verdict (which waits for SuccessThreshold): a member that
// answered a probe ends its rest for its own failures at once
// (rotation.FailureRest). The lease stores implement it.
type AnswerSink interface {
	Answered(name string)
}

// ProbeRecorder observes every probe (a metrics histogram and failure
// counter in cmd); the pool package does not import the metrics package.
type ProbeRecorder interface {
	ObserveProbe(member string, d time.Duration, ok bool)
}

// ProbeForgetter is optionally implemented by a ProbeRecorder to drop a
// removed member's series when the prober prunes its state.
type ProbeForgetter interface {
	ForgetProbe(member string)
}

// ProberOptions configures NewProber; zero values mean the defaults.
type ProberOptions struct {
	// URL is fetched through every member (http or https; required).
	URL string
	// Interval between probe rounds (default 10s).
	Interval time.Duration
	// Timeout bounds one probe, dial to response headers (default 5s).
	Timeout time.Duration
	// SuccessThreshold consecutive successes make an unhealthy member
	// healthy (default 1).
	SuccessThreshold int
	// FailureThreshold consecutive failures make a healthy member unhealthy
	// (default 3).
	FailureThreshold int
	// ExpectedStatus lists the statuses that count as success; empty means
	// any 2xx. Redirects are not followed.
	ExpectedStatus []int
	// TLSConfig is used for https probe URLs and https proxies; nil means
	// the system roots.
	TLSConfig *tls.Config
	// Concurrency bounds probes in flight per round (default 16).
	Concurrency int
	// Recorder, when set, observes every probe.
	Recorder ProbeRecorder
	// Logger receives verdict changes (Info); nil discards.
	Logger *slog.Logger
}

// Prober probes every member through the member itself - an upstream proxy
// is used as the proxy, a direct member dials from its source address - and
// feeds the verdicts to a HealthSink. A verdict flips only after
// SuccessThreshold / FailureThreshold consecutive results, except a
// member's first probe, which sets it at once.
type Prober struct {
	members func() []Member
	sink    HealthSink
	o       ProberOptions
	target  *url.URL

	mu     sync.Mutex
	states map[string]*probeState
}

type probeState struct {
	member  Member // as last probed; a new endpoint (SameEndpoint) starts over
	verdict probe.Counter
	latency time.Duration // last successful probe
}

// NewProber validates o and returns a prober that reads the current members
// from members at every round, so reloads are picked up.
func NewProber(members func() []Member, sink HealthSink, o ProberOptions) (*Prober, error) {
	if members == nil || sink == nil {
		return nil, errors.New("prober: members and sink are required")
	}
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("probe URL %q: want an absolute http:// or https:// URL", redact.URL(o.URL))
	}
	if o.SuccessThreshold < 0 || o.FailureThreshold < 0 {
		return nil, errors.New("probe thresholds must not be negative")
	}
	for _, s := range o.ExpectedStatus {
		if s < 100 || s > 599 {
			return nil, fmt.Errorf("probe expected status %d is not an HTTP status", s)
		}
	}
	if o.Interval <= 0 {
		o.Interval = DefaultProbeInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultProbeTimeout
	}
	if o.SuccessThreshold == 0 {
		o.SuccessThreshold = DefaultProbeSuccessThreshold
	}
	if o.FailureThreshold == 0 {
		o.FailureThreshold = DefaultProbeFailureThreshold
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultProbeConcurrency
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.ExpectedStatus = slices.Clone(o.ExpectedStatus)
	return &Prober{members: members, sink: sink, o: o, target: u, states: map[string]*probeState{}}, nil
}

// Run probes every member now and then every Interval until ctx ends.
func (p *Prober) Run(ctx context.Context) {
	t := time.NewTicker(p.o.Interval)
	defer t.Stop()
	for {
		p.ProbeAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ProbeAll runs one round: probes every current member (at most Concurrency
// at a time), applies the verdicts, and prunes the state of members that
// are gone. It returns when the round is done.
func (p *Prober) ProbeAll(ctx context.Context) {
	members := p.members()
	sem := make(chan struct{}, p.o.Concurrency)
	var wg sync.WaitGroup
	for _, m := range members {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			d, err := p.probe(ctx, m)
			if ctx.Err() != nil {
				return // shutting down: not the member's fault
			}
			p.record(m, d, err)
		})
	}
	wg.Wait()
	p.prune(members)
}

// probe fetches the probe URL through m (probe.Fetch: a fresh transport
// that keeps no connection, never HTTP(S)_PROXY from the environment); a
// direct member dials from its source address.
func (p *Prober) probe(ctx context.Context, m Member) (time.Duration, error) {
	res, err := probe.Fetch(ctx, probe.Request{
		Target:    p.target,
		Proxy:     m.URL,
		LocalAddr: m.SourceAddr,
		Timeout:   p.o.Timeout,
		TLSConfig: p.o.TLSConfig,
		UserAgent: "proxyfleet-probe",
	})
	if err != nil {
		return res.Latency, err
	}
	if !p.expected(res.Answer.StatusCode) {
		return res.Latency, fmt.Errorf("probe answered %s", res.Answer.Status)
	}
	return res.Latency, nil
}

func (p *Prober) expected(status int) bool {
	if len(p.o.ExpectedStatus) == 0 {
		return status >= 200 && status <= 299
	}
	return slices.Contains(p.o.ExpectedStatus, status)
}

// record applies one probe result to the member's verdict and hands it on.
func (p *Prober) record(m Member, d time.Duration, err error) {
	ok := err == nil
	if p.o.Recorder != nil {
		p.o.Recorder.ObserveProbe(m.Name, d, ok)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.states[m.Name]
	if st == nil || !st.member.SameEndpoint(m) {
		st = &probeState{member: m}
		p.states[m.Name] = st
	}
	was, known := st.verdict.Verdict()
	if ok {
		st.latency = d
	}
	st.verdict.Observe(ok, p.o.SuccessThreshold, p.o.FailureThreshold)
	healthy, _ := st.verdict.Verdict()
	p.sink.SetHealth(m.Name, healthy, st.latency)
	if as, isAS := p.sink.(AnswerSink); ok && isAS {
		as.Answered(m.Name)
	}
	if !known || was != healthy {
		attrs := []any{"member", m.Name, "upstream", m.Redacted(), "healthy", healthy, "latency", d}
		if err != nil {
			attrs = append(attrs, "error", err.Error())
		}
		p.o.Logger.Info("member health verdict", attrs...)
	}
}

// prune forgets members that are no longer listed.
func (p *Prober) prune(current []Member) {
	keep := make(map[string]bool, len(current))
	for _, m := range current {
		keep[m.Name] = true
	}
	p.mu.Lock()
	var gone []string
	for name := range p.states {
		if !keep[name] {
			delete(p.states, name)
			gone = append(gone, name)
		}
	}
	p.mu.Unlock()
	if f, ok := p.o.Recorder.(ProbeForgetter); ok {
		for _, name := range gone {
			f.ForgetProbe(name)
		}
	}
}

// Healthy reports the prober's current verdict for a member, and whether it
// has one yet (for status pages and tests).
func (p *Prober) Healthy(name string) (healthy, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.states[name]; st != nil {
		return st.verdict.Verdict()
	}
	return false, false
}
