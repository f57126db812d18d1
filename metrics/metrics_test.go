package metrics

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/proxyfleet/proxyfleet/pool"
)

func TestFedVectorsRecordWhatCallersReport(t *testing.T) {
	tests := []struct {
		name   string
		record func(m *Metrics)
		metric string
		want   string
	}{
		{
			name: "requests are counted by member and outcome",
			record: func(m *Metrics) {
				m.Request("sq1", "ok", 20*time.Millisecond)
				m.Request("sq1", "ok", 30*time.Millisecond)
				m.Request("sq2", "banned", time.Second)
			},
			metric: "proxyfleet_gateway_requests_total",
			want: `
# HELP proxyfleet_gateway_requests_total Client requests and CONNECT tunnels handled by the gateway, by the member that served them and the outcome.
# TYPE proxyfleet_gateway_requests_total counter
proxyfleet_gateway_requests_total{member="sq1",outcome="ok"} 2
proxyfleet_gateway_requests_total{member="sq2",outcome="banned"} 1
`,
		},
		{
			name: "MITM handshakes are counted by leg and resumption",
			record: func(m *Metrics) {
				m.MITMHandshake("client", false)
				m.MITMHandshake("client", true)
				m.MITMHandshake("client", true)
				m.MITMHandshake("site", true)
			},
			metric: "proxyfleet_gateway_mitm_handshakes_total",
			want: `
# HELP proxyfleet_gateway_mitm_handshakes_total Completed TLS handshakes of intercepted tunnels, by leg (client: the client's with the gateway; site: the gateway's with the site under --mitm-fingerprint mirror) and whether they resumed a session.
# TYPE proxyfleet_gateway_mitm_handshakes_total counter
proxyfleet_gateway_mitm_handshakes_total{leg="client",resumed="false"} 1
proxyfleet_gateway_mitm_handshakes_total{leg="client",resumed="true"} 2
proxyfleet_gateway_mitm_handshakes_total{leg="site",resumed="false"} 0
proxyfleet_gateway_mitm_handshakes_total{leg="site",resumed="true"} 1
`,
		},
		{
			name: "upstream failures are counted per member",
			record: func(m *Metrics) {
				m.UpstreamFailure("sq1")
				m.UpstreamFailure("sq1")
			},
			metric: "proxyfleet_gateway_upstream_failures_total",
			want: `
# HELP proxyfleet_gateway_upstream_failures_total Member-wide upstream failures (refused, reset, timed out, TLS or SOCKS5 handshake, 407, broken for sites other members reach), by member; an answer that a site is unreachable is none.
# TYPE proxyfleet_gateway_upstream_failures_total counter
proxyfleet_gateway_upstream_failures_total{member="sq1"} 2
`,
		},
		{
			name: "bytes relayed add up per direction and ignore non-positive counts",
			record: func(m *Metrics) {
				m.BytesRelayed("up", 100)
				m.BytesRelayed("up", 23)
				m.BytesRelayed("down", 4096)
				m.BytesRelayed("down", 0)
				m.BytesRelayed("down", -1)
			},
			metric: "proxyfleet_gateway_bytes_relayed_total",
			want: `
# HELP proxyfleet_gateway_bytes_relayed_total Bytes relayed between clients and upstreams, by direction (up: client to target; down: target to client).
# TYPE proxyfleet_gateway_bytes_relayed_total counter
proxyfleet_gateway_bytes_relayed_total{direction="down"} 4096
proxyfleet_gateway_bytes_relayed_total{direction="up"} 123
`,
		},
		{
			name: "probe failures count only failed probes but every probed member has a series",
			record: func(m *Metrics) {
				m.ObserveProbe("sq1", 10*time.Millisecond, true)
				m.ObserveProbe("sq2", time.Second, false)
				m.ObserveProbe("sq2", time.Second, false)
			},
			metric: "proxyfleet_probe_failures_total",
			want: `
# HELP proxyfleet_probe_failures_total Failed health probes through a member.
# TYPE proxyfleet_probe_failures_total counter
proxyfleet_probe_failures_total{member="sq1"} 0
proxyfleet_probe_failures_total{member="sq2"} 2
`,
		},
		{
			name: "lease requests are counted by outcome",
			record: func(m *Metrics) {
				m.LeaseRequest("granted")
				m.LeaseRequest("granted")
				m.LeaseRequest("no_match")
			},
			metric: "proxyfleet_lease_requests_total",
			want: `
# HELP proxyfleet_lease_requests_total Lease API requests by outcome.
# TYPE proxyfleet_lease_requests_total counter
proxyfleet_lease_requests_total{outcome="granted"} 2
proxyfleet_lease_requests_total{outcome="no_match"} 1
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			m := New(reg)
			tt.record(m)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tt.want), tt.metric); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestHistogramsObserveEveryEvent(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	m.Request("sq1", "ok", 20*time.Millisecond)
	m.Request("sq2", "ok", 2*time.Second)
	m.Request("", "no_member", time.Millisecond)
	m.ObserveProbe("sq1", 40*time.Millisecond, true)
	m.ObserveProbe("sq1", 3*time.Second, false)

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	sums := map[string]float64{}
	for _, f := range families {
		for _, mt := range f.GetMetric() {
			h := mt.GetHistogram()
			if h == nil {
				continue
			}
			key := f.GetName()
			for _, l := range mt.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			counts[key] = h.GetSampleCount()
			sums[key] = h.GetSampleSum()
		}
	}
	want := map[string]uint64{
		"proxyfleet_gateway_request_duration_seconds,outcome=ok":        2,
		"proxyfleet_gateway_request_duration_seconds,outcome=no_member": 1,
		"proxyfleet_probe_duration_seconds,member=sq1":                  2,
	}
	for k, n := range want {
		if counts[k] != n {
			t.Errorf("%s: sample count %d, want %d (all: %v)", k, counts[k], n, counts)
		}
	}
	if got := sums["proxyfleet_gateway_request_duration_seconds,outcome=ok"]; got < 2.019 || got > 2.021 {
		t.Errorf("request duration sum = %v, want 2.02 seconds", got)
	}
	if len(counts) != len(want) {
		t.Errorf("histogram series %v, want exactly %v (no member label on the request histogram)", counts, want)
	}
}

func TestForgetMemberDeletesOnlyThatMembersSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	for _, name := range []string{"gone", "kept"} {
		m.Request(name, "ok", time.Millisecond)
		m.UpstreamFailure(name)
		m.ObserveProbe(name, time.Millisecond, false)
	}
	m.ForgetMember("gone")

	for _, metric := range []string{
		"proxyfleet_gateway_requests_total",
		"proxyfleet_gateway_upstream_failures_total",
		"proxyfleet_probe_duration_seconds",
		"proxyfleet_probe_failures_total",
	} {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		members := []string{}
		for _, f := range families {
			if f.GetName() != metric {
				continue
			}
			for _, mt := range f.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "member" {
						members = append(members, l.GetValue())
					}
				}
			}
		}
		if len(members) != 1 || members[0] != "kept" {
			t.Errorf("%s: members %v after forgetting \"gone\", want [kept]", metric, members)
		}
	}
}

func TestForgetProbeKeepsTheMembersRequestSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	m.Request("gone", "ok", time.Millisecond)
	m.ObserveProbe("gone", time.Millisecond, false)
	m.ForgetProbe("gone")
	if n := testutil.CollectAndCount(m.probeDuration) + testutil.CollectAndCount(m.probeFailures); n != 0 {
		t.Errorf("%d probe series left after ForgetProbe, want 0", n)
	}
	if n := testutil.CollectAndCount(m.requests); n != 1 {
		t.Errorf("%d request series after ForgetProbe, want the 1 recorded", n)
	}
}

func TestNewPanicsOnDoubleRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg)
	defer func() {
		if recover() == nil {
			t.Fatal("registering the vectors twice did not panic")
		}
	}()
	New(reg)
}

type fakePool struct {
	members   []pool.MemberStatus
	leases    int
	cooldowns int
}

func (f *fakePool) Members() []pool.MemberStatus { return f.members }
func (f *fakePool) ActiveLeases() int            { return f.leases }
func (f *fakePool) ActiveCooldowns() int         { return f.cooldowns }

func TestPoolCollectorReadsStateAtEveryScrape(t *testing.T) {
	state := &fakePool{
		members: []pool.MemberStatus{
			{Member: pool.Member{Name: "a"}, Healthy: true},
			{Member: pool.Member{Name: "b"}, Healthy: true},
			{Member: pool.Member{Name: "c"}, Healthy: false},
			// Healthy by probe but inside an upstream-failure window: out of service.
			{Member: pool.Member{Name: "d"}, Healthy: true, Cooldowns: map[string]time.Time{"": time.Now().Add(time.Minute)}},
			// Resting for one site only: still in service.
			{Member: pool.Member{Name: "e"}, Healthy: true, Cooldowns: map[string]time.Time{"example.com": time.Now().Add(time.Minute)}},
		},
		leases:    4,
		cooldowns: 2,
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewPoolCollector(state))
	names := []string{"proxyfleet_leases_active", "proxyfleet_cooldowns_active", "proxyfleet_members"}

	want := `
# HELP proxyfleet_cooldowns_active Running cooldowns ({member, target} pairs and member-wide upstream-failure windows).
# TYPE proxyfleet_cooldowns_active gauge
proxyfleet_cooldowns_active 2
# HELP proxyfleet_leases_active Unexpired leases in the pool.
# TYPE proxyfleet_leases_active gauge
proxyfleet_leases_active 4
# HELP proxyfleet_members Pool members by whether they are in service: healthy by probe and not out for every target after an upstream failure.
# TYPE proxyfleet_members gauge
proxyfleet_members{healthy="false"} 2
proxyfleet_members{healthy="true"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}

	// The next scrape sees the new state without anyone updating a gauge.
	state.members = state.members[:1]
	state.leases = 0
	state.cooldowns = 7
	want = `
# HELP proxyfleet_cooldowns_active Running cooldowns ({member, target} pairs and member-wide upstream-failure windows).
# TYPE proxyfleet_cooldowns_active gauge
proxyfleet_cooldowns_active 7
# HELP proxyfleet_leases_active Unexpired leases in the pool.
# TYPE proxyfleet_leases_active gauge
proxyfleet_leases_active 0
# HELP proxyfleet_members Pool members by whether they are in service: healthy by probe and not out for every target after an upstream failure.
# TYPE proxyfleet_members gauge
proxyfleet_members{healthy="false"} 0
proxyfleet_members{healthy="true"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
}

func TestMetricNamesPassLint(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	m.Request("a", "ok", time.Millisecond)
	m.UpstreamFailure("a")
	m.BytesRelayed("up", 1)
	m.ObserveProbe("a", time.Millisecond, false)
	m.LeaseRequest("granted")
	reg.MustRegister(NewPoolCollector(&fakePool{}))
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Code, string(body)
}

func TestHandlerServesMetricsHealthAndReadiness(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Request("sq1", "ok", time.Millisecond)
	var r Readiness
	h := Handler(reg, r.Ready)

	code, body := get(t, h, "/metrics")
	if code != http.StatusOK || !strings.Contains(body, `proxyfleet_gateway_requests_total{member="sq1",outcome="ok"} 1`) {
		t.Fatalf("/metrics = %d %q, want 200 with the request counter", code, body)
	}

	steps := []struct {
		name      string
		transit   func()
		wantReady int
		wantBody  string
	}{
		{"starting is not ready", func() {}, http.StatusServiceUnavailable, "not ready: starting"},
		{"serving is ready", r.Serving, http.StatusOK, "ready"},
		{"stopping is not ready", r.Stopping, http.StatusServiceUnavailable, "not ready: shutting down"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.transit()
			code, body := get(t, h, "/readyz")
			if code != s.wantReady || !strings.Contains(body, s.wantBody) {
				t.Errorf("/readyz = %d %q, want %d containing %q", code, body, s.wantReady, s.wantBody)
			}
			if code, _ := get(t, h, "/healthz"); code != http.StatusOK {
				t.Errorf("/healthz = %d, want 200 while the process runs", code)
			}
		})
	}

	if code, _ := get(t, h, "/nope"); code != http.StatusNotFound {
		t.Errorf("/nope = %d, want 404", code)
	}
}

func TestHandlerReportsTheReadyFuncsError(t *testing.T) {
	h := Handler(prometheus.NewRegistry(), func() error { return errors.New("pool API unreachable") })
	code, body := get(t, h, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "pool API unreachable") {
		t.Fatalf("/readyz = %d %q, want 503 naming the reason", code, body)
	}
}
