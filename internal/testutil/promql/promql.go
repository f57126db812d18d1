// Package promql reads the PromQL the chart ships (ChartQueries: the
// Grafana dashboard's and the alert rules' expressions) and names the
// metrics an expression selects (MetricNames), so a test can check that
// every metric the chart queries is one proxyfleet exports.
//
// It imports sigs.k8s.io/yaml and nothing of ours (never the metrics it is
// checked against); it is a package of its own so that internal/testutil
// does not link a YAML parser into every test.
package promql

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// promqlKeywords are PromQL words that are not metric names.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "bool": true, "offset": true, "inf": true, "nan": true,
}

var (
	promqlString   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promqlBraces   = regexp.MustCompile(`\{[^{}]*\}`)
	promqlBrackets = regexp.MustCompile(`\[[^\[\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	// A number, a duration (5m, 1h30m), or an identifier.
	promqlToken = regexp.MustCompile(`\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)?|[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// MetricNames returns the metric names expr selects, sorted and
// unique: every identifier that is not a function call, a keyword, a label
// (in matchers or grouping lists), a string, a number or a range. It knows
// the PromQL the chart's dashboard and alerts use, not all of PromQL
// (no __name__ matchers), which is what a test of those files needs.
func MetricNames(expr string) []string {
	s := promqlString.ReplaceAllString(expr, `""`)
	s = promqlBraces.ReplaceAllString(s, " ")
	s = promqlBrackets.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range promqlToken.FindAllStringIndex(s, -1) {
		tok := s[loc[0]:loc[1]]
		if tok[0] >= '0' && tok[0] <= '9' || promqlKeywords[strings.ToLower(tok)] {
			continue
		}
		if rest := strings.TrimLeft(s[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function
		}
		if loc[0] > 0 && s[loc[0]-1] == '$' {
			continue // a dashboard variable
		}
		names = append(names, tok)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// ChartQueries reads the PromQL of the chart's Grafana dashboard and alert
// rules under the module root: expressions keyed by where they are
// ("dashboard: <panel> <refId>", "alert: <name>").
func ChartQueries(root string) (map[string]string, error) {
	out := map[string]string{}
	raw, err := os.ReadFile(filepath.Join(root, "charts", "proxyfleet", "dashboards", "proxyfleet.json"))
	if err != nil {
		return nil, err
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	for _, p := range dash.Panels {
		for _, t := range p.Targets {
			out["dashboard: "+p.Title+" "+t.RefID] = t.Expr
		}
	}
	raw, err = os.ReadFile(filepath.Join(root, "charts", "proxyfleet", "rules", "proxyfleet-alerts.yaml"))
	if err != nil {
		return nil, err
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		return nil, fmt.Errorf("alert rules: %w", err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out["alert: "+r.Alert] = r.Expr
		}
	}
	return out, nil
}
