package sites

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The per-site parsers read an operator's text; each either refuses it
// with an error or returns what the text says.

// FuzzParseHosts: a list reads only if each pattern reads alone;
// a host a pattern names exactly matches it (in any case, with or without
// a final dot), a name below a *.domain pattern matches and the domain
// itself does not; Match takes any host.
func FuzzParseHosts(f *testing.F) {
	for _, s := range [][3]string{{"example.com", "*.bank.example", "a.bank.example"}, {"10.0.0.1", "[::1]", "::1"}, {"Example.COM.", "*.x", "x"}, {"*.", "a b", "é"}, {"::%ſ", "fe80::1%25eth0", "::%S"}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, a, b, host string) {
		hp, err := ParseHosts([]string{a, b})
		if err != nil {
			if !strings.Contains(err.Error(), "host pattern") {
				t.Fatalf("error %q does not say which pattern", err)
			}
			return
		}
		_ = hp.Match(host)
		for _, p := range []string{a, b} {
			one, err := ParseHosts([]string{p})
			if err != nil {
				t.Fatalf("%q read in a list but not alone: %v", p, err)
			}
			key, wild, _ := ParsePattern(p)
			if !wild {
				if !one.Match(key) || !one.Match(strings.ToUpper(key)+".") {
					t.Fatalf("pattern %q does not match its own host %q", p, key)
				}
				continue
			}
			if !one.Match("sub"+key) || one.Match(strings.TrimPrefix(key, ".")) {
				t.Fatalf("pattern %q: matches sub%s %v (want true), the domain itself %v (want false)",
					p, key, one.Match("sub"+key), one.Match(strings.TrimPrefix(key, ".")))
			}
		}
	})
}

// FuzzParseDurations: an entry that reads gives its exact host the
// positive duration it wrote.
func FuzzParseDurations(f *testing.F) {
	for _, s := range []string{"slow.example=40s", "*.example.com=1m30s", "10.0.0.1=1ms", "a=0s", "=5s", "a=-1s", "a==b", "a.example=1h=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, entry string) {
		sd, err := ParseDurations([]string{entry})
		if err != nil {
			return
		}
		pat, val, _ := strings.Cut(entry, "=")
		want, perr := time.ParseDuration(strings.TrimSpace(val))
		if perr != nil || want <= 0 {
			t.Fatalf("%q accepted with a duration that does not read as positive", entry)
		}
		key, wild, err := ParsePattern(pat)
		if err != nil {
			t.Fatalf("%q accepted with a pattern that does not read: %v", entry, err)
		}
		host := key
		if wild {
			host = "sub" + key
		}
		if got, ok := sd.For(host); !ok || got != want {
			t.Fatalf("%q: For(%q) = %v, %v; want %v", entry, host, got, ok, want)
		}
	})
}

// FuzzParsePorts: a list that reads is ports 1-65535, each once, and
// reads back the same when written out.
func FuzzParsePorts(f *testing.F) {
	for _, s := range []string{"80", "80,8080", " 80 , 80 ", "", "0", "65536", "a", "80,,81", "+80", "0x50"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ports, err := ParsePorts(s)
		if err != nil {
			return
		}
		var out []string
		for i, p := range ports {
			if p == 0 || slices.Contains(ports[:i], p) {
				t.Fatalf("%q: ports %v hold 0 or a repeat", s, ports)
			}
			out = append(out, strconv.Itoa(int(p)))
		}
		again, err := ParsePorts(strings.Join(out, ","))
		if err != nil || !slices.Equal(again, ports) {
			t.Fatalf("%q: %v written out reads back as %v, %v", s, ports, again, err)
		}
	})
}
