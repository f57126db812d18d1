package promlite

import (
	"bufio"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// HandlerOpts configure HandlerFor; none are read (client_golang's
// defaults are what the sidecar serves).
type HandlerOpts struct{}

// HandlerFor serves g in the text exposition format, version 0.0.4.
func HandlerFor(g Gatherer, _ HandlerOpts) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		bw := bufio.NewWriter(w)
		writeText(bw, g.gather())
		_ = bw.Flush()
	})
}

func writeText(w *bufio.Writer, fams []family) {
	for _, f := range fams {
		if len(f.samples) == 0 {
			continue
		}
		if f.help != "" {
			w.WriteString("# HELP " + f.name + " " + escapeHelp(f.help) + "\n")
		}
		w.WriteString("# TYPE " + f.name + " " + f.kind + "\n")
		for _, s := range f.samples {
			pairs := s.pairs()
			if s.s.hist == nil {
				writeSample(w, f.name, pairs, "", "", s.s.value)
				continue
			}
			h := s.s.hist
			for i, up := range h.upper {
				writeSample(w, f.name+"_bucket", pairs, "le", formatFloat(up), float64(h.counts[i]))
			}
			writeSample(w, f.name+"_bucket", pairs, "le", "+Inf", float64(h.count))
			writeSample(w, f.name+"_sum", pairs, "", "", h.sum)
			writeSample(w, f.name+"_count", pairs, "", "", float64(h.count))
		}
	}
}

func writeSample(w *bufio.Writer, name string, pairs []labelPair, extraName, extraValue string, v float64) {
	w.WriteString(name)
	if len(pairs) > 0 || extraName != "" {
		w.WriteByte('{')
		for i, p := range pairs {
			if i > 0 {
				w.WriteByte(',')
			}
			w.WriteString(p.name + `="` + escapeLabel(p.value) + `"`)
		}
		if extraName != "" {
			if len(pairs) > 0 {
				w.WriteByte(',')
			}
			w.WriteString(extraName + `="` + extraValue + `"`)
		}
		w.WriteByte('}')
	}
	w.WriteByte(' ')
	w.WriteString(formatFloat(v))
	w.WriteByte('\n')
}

func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	case math.IsNaN(f):
		return "NaN"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }
