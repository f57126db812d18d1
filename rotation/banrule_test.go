package rotation

import (
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseBanRuleRejectsMalformedRules(t *testing.T) {
	tests := []struct {
		name, rule, wantErr string
	}{
		{"empty", "  ", "is empty"},
		{"no action", "status=403", "no action="},
		{"action alone matches everything", "action=banned", "matches every answer"},
		{"unknown action", "status=403 action=block", "want action=rate_limited or action=banned"},
		{"unknown field names it", "status=403 code=1 action=banned", `field "code=1": unknown field`},
		{"bad status", "status=4x3 action=banned", `field "status=4x3"`},
		{"empty status", "status= action=banned", "empty status list"},
		{"status twice", "status=403 status=503 action=banned", "status given twice"},
		{"header without regexp", "header:cf-mitigated action=banned", "want header:NAME~REGEX"},
		{"bad header name", "header:a/b~x action=banned", "is not a header name"},
		{"header twice", "header:A~x header:a~y action=banned", "header A given twice"},
		{"bad regexp", "body~(unclosed action=banned", "bad regular expression"},
		{"empty regexp", "body~ action=banned", "empty regular expression"},
		{"body twice", "body~a body~b action=banned", "body given twice"},
		{"action twice", "status=403 action=banned action=banned", "action given twice"},
		{"unknown preset", "preset=nope", `unknown preset "nope" (presets: captcha, cloudflare-challenge, empty-200)`},
		{"preset with more fields", "preset=captcha action=banned", "a preset stands alone"},
		{"too long", "body~" + strings.Repeat("a", maxBanRuleLen) + " action=banned", "longer than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseBanRule(tc.rule)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParseBanRule(%q) = %v, want an error containing %q", tc.rule, err, tc.wantErr)
			}
		})
	}
}

func TestBanRulesClassifyAnswers(t *testing.T) {
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	page := func(status int, h http.Header, body string) Answer {
		return Answer{Status: status, Header: h, Body: []byte(body), BodyRead: true}
	}
	tests := []struct {
		name     string
		rules    []string
		a        Answer
		want     Result
		matched  bool
		needBody bool
	}{
		{"body rule matches a 200 challenge page", []string{`status=200 body~(?i)captcha action=banned`},
			page(200, hdr(), "<html>Please solve the CAPTCHA</html>"), ResultBanned, true, true},
		{"body rule leaves an ordinary page alone", []string{`status=200 body~(?i)captcha action=banned`},
			page(200, hdr(), "<html>products</html>"), "", false, true},
		{"body rule never matches an answer whose body was not read", []string{`status=200 body~^$ action=banned`},
			Answer{Status: 200, Header: hdr()}, "", false, true},
		{"status field limits the rule", []string{`status=200 body~(?i)captcha action=banned`},
			page(404, hdr(), "captcha"), "", false, false},
		{"header rule needs no body", []string{`status=403,503 header:cf-mitigated~^challenge$ action=banned`},
			page(503, hdr("Cf-Mitigated", "challenge"), ""), ResultBanned, true, false},
		{"header rule matches any of the values", []string{`header:x-block~yes action=rate_limited`},
			page(200, hdr("X-Block", "no", "X-Block", "yes"), ""), ResultRateLimited, true, false},
		{"header rule wants the header present", []string{`header:x-block~.* action=banned`},
			page(200, hdr(), ""), "", false, false},
		{"first matching rule decides", []string{`status=503 action=rate_limited`, `status=503 action=banned`},
			page(503, hdr(), ""), ResultRateLimited, true, false},
		{"an earlier head-only rule spares the body read", []string{`status=200 header:x-ok~1 action=rate_limited`, `status=200 body~x action=banned`},
			page(200, hdr("X-Ok", "1"), ""), ResultRateLimited, true, false},
		{"cloudflare preset", []string{"preset=cloudflare-challenge"},
			page(403, hdr("Cf-Mitigated", "Challenge"), ""), ResultBanned, true, false},
		{"cloudflare preset wants the marker", []string{"preset=cloudflare-challenge"},
			page(403, hdr(), ""), "", false, false},
		{"captcha preset on a reCAPTCHA page", []string{"preset=captcha"},
			page(200, hdr(), `<div class="g-recaptcha" data-sitekey="x"></div>`), ResultBanned, true, true},
		{"captcha preset leaves a page that says captcha in prose", []string{"preset=captcha"},
			page(200, hdr(), `<p>we wrote about captchas</p>`), "", false, true},
		{"empty-200 preset on an empty body", []string{"preset=empty-200"},
			page(200, hdr(), ""), ResultBanned, true, true},
		{"empty-200 preset on a body", []string{"preset=empty-200"},
			page(200, hdr(), "{}"), "", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := ParseBanRules(tc.rules)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := rs.Classify(tc.a)
			if got != tc.want || ok != tc.matched {
				t.Errorf("Classify = %q, %v; want %q, %v", got, ok, tc.want, tc.matched)
			}
			if nb := rs.NeedsBody(tc.a.Status, tc.a.Header); nb != tc.needBody {
				t.Errorf("NeedsBody = %v, want %v", nb, tc.needBody)
			}
		})
	}
}

func TestClassifyAnswerReadsRulesBeforeStatusLists(t *testing.T) {
	rs, err := ParseBanRules([]string{`status=403 header:x-soft~1 action=rate_limited`})
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultClassifier()
	c.Rules = rs
	if got := c.ClassifyAnswer(Answer{Status: 403, Header: http.Header{"X-Soft": {"1"}}}); got != ResultRateLimited {
		t.Errorf("a rule for 403 gave %q, want rate_limited", got)
	}
	if got := c.ClassifyAnswer(Answer{Status: 403, Header: http.Header{}}); got != ResultBanned {
		t.Errorf("a 403 no rule matches gave %q, want banned (the status list)", got)
	}
	if c.NeedsBody(200, nil) || DefaultClassifier().NeedsBody(200, nil) {
		t.Error("no body rule, yet NeedsBody")
	}
}

func TestBanRuleTextIsNormalised(t *testing.T) {
	rs, err := ParseBanRule("  status=429\t action=rate_limited ")
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Text != "status=429 action=rate_limited" || rs[0].Action != ResultRateLimited {
		t.Fatalf("parsed %+v", rs[0])
	}
}

// FuzzParseBanRule: the parser never panics, and an accepted rule has an
// action, at least one condition, and matches without panicking.
func FuzzParseBanRule(f *testing.F) {
	f.Add("status=200 body~(?i)captcha action=banned")
	f.Add("status=403,503 header:cf-mitigated~^challenge$ action=banned")
	f.Add("preset=captcha")
	f.Add("header:x~ action=banned")
	f.Add("body~[ action=rate_limited")
	f.Fuzz(func(t *testing.T, s string) {
		rs, err := ParseBanRule(s)
		if err != nil {
			if !utf8.ValidString(err.Error()) && utf8.ValidString(s) {
				t.Fatalf("invalid UTF-8 in the message for a valid rule: %q", err)
			}
			return
		}
		for _, r := range rs {
			if r.Action != ResultBanned && r.Action != ResultRateLimited {
				t.Fatalf("accepted %q with action %q", s, r.Action)
			}
			if r.Statuses == nil && r.Headers == nil && r.Body == nil {
				t.Fatalf("accepted %q that matches everything", s)
			}
			a := Answer{Status: 200, Header: http.Header{"X": {s}}, Body: []byte(s), BodyRead: true}
			_ = r.Match(a)
			_ = BanRules(rs).NeedsBody(403, a.Header)
		}
	})
}
