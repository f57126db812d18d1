package statuspage

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"html"
	"net/http"
	"strings"
)

// The page is one HTML file with its style and script inline: it needs no
// other request than its JSON, so it works offline and when saved. The
// Content-Security-Policy allows exactly that script and style (by hash)
// and fetches to the page's own origin.
var (
	//go:embed page.html
	pageHTML string
	//go:embed page.css
	pageCSS string
	//go:embed page.js
	pageJS string
)

// csp is the page's Content-Security-Policy: nothing but its own inline
// script and style, and connections to its own origin (the JSON).
var csp = "default-src 'none'; script-src '" + hash(pageJS) + "'; style-src '" + hash(pageCSS) +
	"'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}

// Paths the handler serves.
const (
	PagePath = "/status"
	JSONPath = "/status.json"
)

// HandlerOptions configures Handler.
type HandlerOptions struct {
	// Title heads the page ("proxyfleet gateway").
	Title string
	// View returns the page's data (a GatewayView or FleetView); it is
	// called for every JSON request and must be safe for concurrent use.
	View func(ctx context.Context) any
	// Next serves every other path (the metrics handler on the gateway's
	// metrics address); nil answers them 404, except "/", which redirects
	// to the page.
	Next http.Handler
}

// Handler serves GET /status (the page) and GET /status.json (its data).
// Both are read-only: other methods are 405.
func Handler(o HandlerOptions) http.Handler {
	page := renderPage(o.Title)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PagePath, func(w http.ResponseWriter, _ *http.Request) {
		h := commonHeaders(w)
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Security-Policy", csp)
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET "+JSONPath, func(w http.ResponseWriter, r *http.Request) {
		var b bytes.Buffer
		if err := json.NewEncoder(&b).Encode(o.View(r.Context())); err != nil {
			http.Error(w, "status: encoding the view failed", http.StatusInternalServerError)
			return
		}
		h := commonHeaders(w)
		h.Set("Content-Type", "application/json")
		_, _ = w.Write(b.Bytes())
	})
	readOnly := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "status: read-only, GET only", http.StatusMethodNotAllowed)
	}
	mux.HandleFunc(PagePath, readOnly)
	mux.HandleFunc(JSONPath, readOnly)
	if o.Next != nil {
		mux.Handle("/", o.Next)
	} else {
		mux.Handle("GET /{$}", http.RedirectHandler(PagePath, http.StatusFound))
	}
	return mux
}

func commonHeaders(w http.ResponseWriter) http.Header {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	return h
}

// renderPage fills the page template: the title (escaped), the style and
// the script.
func renderPage(title string) []byte {
	r := strings.NewReplacer("{{TITLE}}", html.EscapeString(title), "{{CSS}}", pageCSS, "{{JS}}", pageJS)
	return []byte(r.Replace(pageHTML))
}
