package charts_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/internal/testutil/promql"
)

func readChartFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGrafanaDashboardAndAlertsAreOffByDefaultAndShipTheFilesWhenOn(t *testing.T) {
	manifest, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, manifest)
	if find(objs, "ConfigMap", releaseName+"-dashboard") != nil || find(objs, "PrometheusRule", "") != nil {
		t.Fatal("the dashboard or the alert rules render by default")
	}

	manifest, err = render(t, map[string]any{"metrics": map[string]any{
		"grafanaDashboard": map[string]any{"enabled": true, "annotations": map[string]any{"grafana_folder": "proxyfleet"}},
		"prometheusRule":   map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus-stack"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	objs = objects(t, manifest)
	cm := find(objs, "ConfigMap", releaseName+"-dashboard")
	if cm == nil {
		t.Fatal("no dashboard ConfigMap with grafanaDashboard.enabled")
	}
	if cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetAnnotations()["grafana_folder"] != "proxyfleet" || cm.GetNamespace() != releaseNS {
		t.Errorf("dashboard ConfigMap labels %v annotations %v namespace %q; want the sidecar's grafana_dashboard: \"1\"",
			cm.GetLabels(), cm.GetAnnotations(), cm.GetNamespace())
	}
	var shipped, file any
	data, _ := cm.Object["data"].(map[string]any)
	if err := json.Unmarshal([]byte(data["proxyfleet.json"].(string)), &shipped); err != nil {
		t.Fatalf("the ConfigMap's dashboard is not JSON: %v", err)
	}
	if err := json.Unmarshal(readChartFile(t, "dashboards/proxyfleet.json"), &file); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(shipped, file) {
		t.Error("the ConfigMap's dashboard differs from dashboards/proxyfleet.json")
	}

	rule := find(objs, "PrometheusRule", releaseName)
	if rule == nil {
		t.Fatal("no PrometheusRule with prometheusRule.enabled")
	}
	var want map[string]any
	if err := yaml.Unmarshal(readChartFile(t, "rules/proxyfleet-alerts.yaml"), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rule.Object["spec"], want) || rule.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule spec or labels differ from rules/proxyfleet-alerts.yaml: labels %v", rule.GetLabels())
	}
	// Helm must not have templated the alerts' own {{ $labels.x }}.
	if !strings.Contains(manifest, "{{ $labels.provider }}") {
		t.Error("the alert annotations lost their {{ $labels.provider }} templates")
	}
}

// TestDashboardAnswersTheOperatorsQuestions pins what the dashboard is for
// and that every query selects metrics proxyfleet or controller-runtime
// exports (e2e/status_test.go checks each name against the running
// binaries' scrapes).
func TestDashboardAnswersTheOperatorsQuestions(t *testing.T) {
	var dash struct {
		UID        string `json:"uid"`
		Templating struct {
			List []struct{ Name, Type string } `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Type, Title string
			Targets     []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(readChartFile(t, "dashboards/proxyfleet.json"), &dash); err != nil {
		t.Fatalf("dashboards/proxyfleet.json: %v", err)
	}
	if dash.UID != "proxyfleet" || len(dash.Templating.List) != 1 || dash.Templating.List[0].Type != "datasource" {
		t.Errorf("uid %q, templating %+v; want uid proxyfleet and one datasource variable", dash.UID, dash.Templating.List)
	}
	var rows []string
	for _, p := range dash.Panels {
		if p.Type == "row" {
			rows = append(rows, p.Title)
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			names := promql.MetricNames(q.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q: %q selects no metric", p.Title, q.Expr)
			}
			for _, n := range names {
				if !strings.HasPrefix(n, "proxyfleet_") && !strings.HasPrefix(n, "controller_runtime_") {
					t.Errorf("panel %q queries %s, which neither binary defines", p.Title, n)
				}
			}
		}
	}
	for _, want := range []string{"Gateway traffic", "Bans and cooldowns by site", "Member health", "Lease utilisation", "Providers", "Reconciles"} {
		if !slices.Contains(rows, want) {
			t.Errorf("the dashboard has no %q row (rows: %q)", want, rows)
		}
	}
}

// promtool is Prometheus' own rule checker (Debian's prometheus package;
// hack/install-deps.sh installs it): the real PromQL parser.
func promtool(t *testing.T, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (make test installs Debian's prometheus package with hack/install-deps.sh): %v", err)
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestAlertRulesAndDashboardQueriesParseWithPromtool runs the alert rules,
// and every dashboard query as a recording rule (Grafana's $__rate_interval
// as 5m), through promtool check rules, so a PromQL typo fails here rather
// than on someone's Grafana; and promtool test rules on the alerts.
func TestAlertRulesAndDashboardQueriesParseWithPromtool(t *testing.T) {
	promtool(t, "check", "rules", filepath.Join(chartDir(t), "rules", "proxyfleet-alerts.yaml"))
	// Three alerts, the subtle ones, fire on what they name (testdata/alerts_test.yaml).
	promtool(t, "test", "rules", filepath.Join("testdata", "alerts_test.yaml"))

	queries, err := promql.ChartQueries(filepath.Dir(filepath.Dir(chartDir(t))))
	if err != nil {
		t.Fatal(err)
	}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for where, expr := range queries {
		if strings.HasPrefix(where, "dashboard: ") {
			rules = append(rules, rule{Record: fmt.Sprintf("proxyfleet_dashboard:query%d", len(rules)), Expr: strings.ReplaceAll(expr, "$__rate_interval", "5m")})
		}
	}
	if len(rules) < 15 {
		t.Fatalf("only %d dashboard queries read", len(rules))
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", p)
}
