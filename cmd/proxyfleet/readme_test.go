//go:build !sidecar

package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/metrics"
	"github.com/proxyfleet/proxyfleet/pool"
)

// readmeFlagRow is one row of the README's gateway flag table.
type readmeFlagRow struct {
	def, env, yamlKey string
}

// readmeFlagTable reads the rows of the "## Flags" table: | `--name ...` | default | env | key | ... |.
func readmeFlagTable(t *testing.T) map[string]readmeFlagRow {
	t.Helper()
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	text := string(raw)
	start := strings.Index(text, "\n## Flags\n")
	if start < 0 {
		t.Fatal("README.md has no ## Flags section")
	}
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	rows := map[string]readmeFlagRow{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 6 {
			t.Fatalf("README flag row has too few cells: %q", line)
		}
		flag := strings.Trim(strings.TrimSpace(cells[1]), "`")
		name := strings.Fields(strings.TrimPrefix(flag, "--"))[0]
		rows[name] = readmeFlagRow{
			def:     strings.TrimSpace(cells[2]),
			env:     strings.Trim(strings.TrimSpace(cells[3]), "`"),
			yamlKey: strings.Trim(strings.TrimSpace(cells[4]), "`"),
		}
	}
	return rows
}

// flagDefault is the default --help shows for a flag, unquoted.
func flagDefault(f cli.Flag) string {
	return strings.Trim(f.(cli.DocGenerationFlag).GetDefaultText(), `"`)
}

func TestREADMEFlagTableMatchesTheFlags(t *testing.T) {
	rows := readmeFlagTable(t)
	flags := gatewayFlags()
	if len(rows) != len(flags) {
		t.Errorf("README lists %d gateway flags, the command has %d", len(rows), len(flags))
	}
	for _, f := range flags {
		name := f.Names()[0]
		row, ok := rows[name]
		if !ok {
			t.Errorf("--%s is missing from the README flag table", name)
			continue
		}
		want := flagDefault(f)
		got := strings.Trim(row.def, "`")
		if strings.HasPrefix(got, "none") {
			got = "" // README's word for "no default"
		}
		if got != want {
			t.Errorf("--%s: README default %q, --help default %q", name, row.def, want)
		}
		if row.env != envVar(name) {
			t.Errorf("--%s: README env %q, want %q", name, row.env, envVar(name))
		}
		wantKey := name
		if name == flagConfig {
			wantKey = "—"
		}
		if row.yamlKey != wantKey {
			t.Errorf("--%s: README YAML key %q, want %q", name, row.yamlKey, wantKey)
		}
	}
}

// readmeBlock returns the first fenced block of lang after heading.
func readmeBlock(t *testing.T, heading, lang string) string {
	t.Helper()
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no %q", heading)
	}
	text = text[i:]
	j := strings.Index(text, "```"+lang+"\n")
	if j < 0 {
		t.Fatalf("no ```%s block after %q", lang, heading)
	}
	text = text[j+len(lang)+4:]
	return text[:strings.Index(text, "```")]
}

func TestREADMEExampleConfigIsValid(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"config.yaml":   readmeBlock(t, "## Flags", "yaml"),
		"tokens.txt":    readmeBlock(t, "### Token clients", "text"),
		"upstreams.txt": "http://10.0.3.8:3128 region=eu\n",
	} {
		if err := os.WriteFile(dir+"/"+name, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := runConfig(t, "--config", dir+"/config.yaml", "--retries", "1")
	if err != nil {
		t.Fatalf("the README's example config.yaml is rejected: %v", err)
	}
	if cfg.Retries != 1 || cfg.Store.DefaultTTL.String() != "2m0s" || len(cfg.Classifier.Ban) != 2 || len(cfg.Clients) != 2 {
		t.Errorf("example config read as retries=%d lease-ttl=%s ban=%v clients=%d", cfg.Retries, cfg.Store.DefaultTTL, cfg.Classifier.Ban, len(cfg.Clients))
	}
}

type emptyPool struct{}

func (emptyPool) Members() []pool.MemberStatus { return nil }
func (emptyPool) ActiveLeases() int            { return 0 }
func (emptyPool) ActiveCooldowns() int         { return 0 }

// ListCooldowns has one cooldown, so the site gauge has a series to gather.
func (emptyPool) ListCooldowns(context.Context) ([]pool.Cooldown, error) {
	return []pool.Cooldown{{Member: "a", Target: "shop.com", Until: time.Now().Add(time.Minute), Reason: "banned"}}, nil
}

func TestREADMEMetricsTableMatchesTheRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	reg.MustRegister(metrics.NewPoolCollector(emptyPool{}), metrics.NewSiteCooldownCollector(emptyPool{}, 0), metrics.NewSitePaceCollector(onePace{}, 0))
	m.Request("a", "ok", time.Millisecond)
	m.UpstreamFailure("a")
	m.BytesRelayed("up", 1)
	m.ObserveProbe("a", time.Millisecond, false)
	m.LeaseRequest("granted")
	// A gateway on a Redis --lease-store also times its round trips.
	metrics.NewLeaseStoreCalls(reg).Observe("acquire", time.Millisecond, nil)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range families {
		have[f.GetName()] = true
	}

	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	text = text[strings.Index(text, "\n## Metrics\n"):]
	documented := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "| `proxyfleet_") {
			documented[strings.Trim(strings.TrimSpace(strings.Split(line, "|")[1]), "`")] = true
		}
	}
	for name := range documented {
		if !have[name] {
			t.Errorf("README documents %s, which the metrics package does not export", name)
		}
	}
	for name := range have {
		if !documented[name] {
			t.Errorf("%s is exported but missing from the README metrics table", name)
		}
	}
}
