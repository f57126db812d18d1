package clients

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/proxyfleet/proxyfleet/pool/quota"
)

const secret = "S3cr3t-t0ken_xyz"

func TestParseReadsWhatEachClientMayUse(t *testing.T) {
	tests := []struct {
		name string
		file string
		want []Client
	}{
		{"all is every member", "ops " + secret + " all\n",
			[]Client{{Name: "ops", Token: secret, Line: 1, All: true}}},
		{"comments and blank lines are skipped, lines counted", "# clients\n\n  team-a " + secret + " pool=fleet/eu\n",
			[]Client{{Name: "team-a", Token: secret, Line: 3, Scopes: []Scope{{Name: "pool fleet/eu", Selector: map[string]string{"proxyfleet.io/namespace": "fleet", "proxyfleet.io/pool": "eu"}}}}}},
		{"scopes keep their written order", "b tok2 select=tier=dc,region=eu pool=fleet/us\n",
			[]Client{{Name: "b", Token: "tok2", Line: 1, Scopes: []Scope{
				{Name: "members with region=eu,tier=dc", Selector: map[string]string{"region": "eu", "tier": "dc"}},
				{Name: "pool fleet/us", Selector: map[string]string{"proxyfleet.io/namespace": "fleet", "proxyfleet.io/pool": "us"}}}}}},
		{"several clients", "a tok1 all\nb tok2 select=region=eu\n",
			[]Client{{Name: "a", Token: "tok1", Line: 1, All: true}, {Name: "b", Token: "tok2", Line: 2, Scopes: []Scope{{Name: "members with region=eu", Selector: map[string]string{"region": "eu"}}}}}},
		{"tabs separate fields too", "a\ttok1\tall\n",
			[]Client{{Name: "a", Token: "tok1", Line: 1, All: true}}},
		{"quotas beside what it may use", "a tok1 leases=20 all rps=50 site-rps=0.5\n",
			[]Client{{Name: "a", Token: "tok1", Line: 1, All: true, Quota: quota.Limits{Leases: 20, RPS: 50, SiteRPS: 0.5}}}},
		{"a byte quota with a decimal suffix", "a tok1 all bytes-per-day=10G\n",
			[]Client{{Name: "a", Token: "tok1", Line: 1, All: true, Quota: quota.Limits{BytesPerDay: 10_000_000_000}}}},
		{"a byte quota in plain bytes", "a tok1 all bytes-per-day=1500\n",
			[]Client{{Name: "a", Token: "tok1", Line: 1, All: true, Quota: quota.Limits{BytesPerDay: 1500}}}},
		{"a zero quota is no limit", "a tok1 all leases=0 rps=0\n",
			[]Client{{Name: "a", Token: "tok1", Line: 1, All: true}}},
		{"the tiers it may use, as written", "a tok1 all tiers=own,datacenter\n",
			[]Client{{Name: "a", Token: "tok1", Line: 1, All: true, Tiers: []string{"own", "datacenter"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d clients, want %d: %+v", len(got), len(tc.want), got)
			}
			for i := range got {
				if !sameClient(got[i], tc.want[i]) {
					t.Errorf("client %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func sameClient(a, b Client) bool {
	if a.Name != b.Name || a.Token != b.Token || a.Line != b.Line || a.All != b.All || len(a.Scopes) != len(b.Scopes) || a.Quota != b.Quota || !slices.Equal(a.Tiers, b.Tiers) {
		return false
	}
	for i := range a.Scopes {
		if a.Scopes[i].Name != b.Scopes[i].Name || !maps.Equal(a.Scopes[i].Selector, b.Scopes[i].Selector) {
			return false
		}
	}
	return true
}

func TestParseRefusesBadLinesNamingTheLineNeverTheToken(t *testing.T) {
	tests := []struct {
		name string
		file string
		want string
	}{
		{"a token without a client name (the old format)", "# old\n" + secret + "\n", "line 2: a token without a client name"},
		{"a first word that is no name", "Team_A " + secret + " all\n", "line 1: the first word is not a client name"},
		{"a token as the first word", secret + " team-a all\n", "line 1: the first word is not a client name"},
		{"nothing it may use", "team-a " + secret + "\n", "line 1 (client team-a): says nothing of what it may use"},
		{"all with a scope", "team-a " + secret + " all pool=fleet/eu\n", "all with pool= or select="},
		{"an unknown key", "team-a " + secret + " region=eu\n", "line 1 (client team-a): unknown field region="},
		{"a field that is no key=value", "team-a " + secret + " everything\n", "field 3 is not all or key=value"},
		{"a token in a field's place", "team-a all " + secret + "\n", "field 3 is not all or key=value"},
		{"a pool without its namespace", "team-a " + secret + " pool=eu\n", "want pool=NAMESPACE/POOL"},
		{"a bad selector", "team-a " + secret + " select=region\n", "select=: selector"},
		{"an empty selector", "team-a " + secret + " select=\n", "select= is empty"},
		{"a scope given twice", "team-a " + secret + " pool=f/eu pool=f/eu\n", "pool f/eu is given twice"},
		{"tiers given twice", "team-a " + secret + " all tiers=own tiers=residential\n", "tiers= is given twice"},
		{"a tier named twice", "team-a " + secret + " all tiers=own,own\n", "tiers=own,own: want tier names, each once"},
		{"an empty tier", "team-a " + secret + " all tiers=own,\n", "tiers=own,: want tier names"},
		{"a name used twice", "a tok1 all\na tok2 all\n", "line 2: client a is already on line 1"},
		{"a token used twice", "a " + secret + " all\nb " + secret + " all\n", "line 2 (client b): its token is already on line 1"},
		{"no client at all", "# nothing\n\n", "holds no client"},
		{"a quota without what it may use", "team-a " + secret + " leases=2\n", "says nothing of what it may use"},
		{"a negative lease quota", "team-a " + secret + " all leases=-1\n", "line 1 (client team-a): leases=-1 is negative"},
		{"a lease quota that is no number", "team-a " + secret + " all leases=many\n", "leases=many: want a whole number"},
		{"a negative rate", "team-a " + secret + " all rps=-5\n", "line 1 (client team-a): rps=-5: want 0 (no limit) to"},
		{"a site rate that is no number", "team-a " + secret + " all site-rps=fast\n", "site-rps=fast: want requests per second"},
		{"an infinite rate", "team-a " + secret + " all rps=Inf\n", "rps=Inf: want requests per second"},
		{"a rate past the largest", "team-a " + secret + " all rps=1e7\n", "rps=1e+07: want 0 (no limit) to"},
		{"a negative byte quota", "team-a " + secret + " all bytes-per-day=-1\n", "bytes-per-day=-1 is negative"},
		{"a byte quota with an unknown suffix", "team-a " + secret + " all bytes-per-day=10GiB\n", "bytes-per-day=10GiB: want a whole number of bytes"},
		{"a byte quota past int64", "team-a " + secret + " all bytes-per-day=99999999999T\n", "bytes-per-day=99999999999T: want a whole number"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.file))
			if err == nil {
				t.Fatalf("accepted %q", tc.file)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error %q shows the token", err)
			}
		})
	}
}

func TestCoversIsAnyScope(t *testing.T) {
	cs, err := Parse(strings.NewReader("a tok1 pool=fleet/eu select=region=us\nb tok2 all\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, b := cs[0], cs[1]
	tests := []struct {
		attrs map[string]string
		want  bool
	}{
		{map[string]string{"proxyfleet.io/namespace": "fleet", "proxyfleet.io/pool": "eu", "x": "y"}, true},
		{map[string]string{"proxyfleet.io/namespace": "fleet", "proxyfleet.io/pool": "us"}, false},
		{map[string]string{"region": "us"}, true},
		{map[string]string{"region": "eu"}, false},
		{nil, false},
	}
	for _, tc := range tests {
		if got := a.Covers(tc.attrs); got != tc.want {
			t.Errorf("a.Covers(%v) = %v, want %v", tc.attrs, got, tc.want)
		}
		if !b.Covers(tc.attrs) {
			t.Errorf("an all client does not cover %v", tc.attrs)
		}
	}
	if b.Selectors() != nil || len(a.Selectors()) != 2 {
		t.Fatalf("selectors: all %v, scoped %v", b.Selectors(), a.Selectors())
	}
}

// FuzzParse: whatever the file, Parse returns clients or an error, and
// every client it returns has a name, a token, and either all or scopes.
func FuzzParse(f *testing.F) {
	f.Add("a tok all\n")
	f.Add("# c\nteam-a tok pool=fleet/eu select=region=eu,tier=dc\n")
	f.Add("tok\n")
	f.Add("a tok tiers=x\n")
	f.Add("a tok all leases=3 rps=0.5 site-rps=2 bytes-per-day=5G\n")
	f.Fuzz(func(t *testing.T, file string) {
		cs, err := Parse(strings.NewReader(file))
		if err != nil {
			return
		}
		names := map[string]bool{}
		for _, c := range cs {
			if !namePattern.MatchString(c.Name) || c.Token == "" || names[c.Name] {
				t.Fatalf("bad client %+v", c)
			}
			names[c.Name] = true
			if c.Quota.Check() != nil {
				t.Fatalf("client %s: a quota Check refuses: %+v", c.Name, c.Quota)
			}
			if c.All == (len(c.Scopes) > 0) {
				t.Fatalf("client %s: all %v with %d scopes", c.Name, c.All, len(c.Scopes))
			}
			for _, s := range c.Scopes {
				if len(s.Selector) == 0 {
					t.Fatalf("client %s: empty scope %+v", c.Name, s)
				}
			}
		}
	})
}
