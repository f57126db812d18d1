package strictyaml

import (
	"reflect"
	"strings"
	"testing"
)

type inner struct {
	Zone  string `json:"zone,omitempty"`
	Count int    `json:"count,omitempty"`
}

type outer struct {
	Name   string           `json:"name"`
	On     *bool            `json:"on,omitempty"`
	Tags   []string         `json:"tags,omitempty"`
	Inner  inner            `json:"inner,omitempty"`
	Hosts  []inner          `json:"hosts,omitempty"`
	Labels map[string]inner `json:"labels,omitempty"`
}

func decode(t *testing.T, in string) (outer, error) {
	t.Helper()
	n, err := Parse([]byte(in))
	if err != nil {
		return outer{}, err
	}
	var o outer
	return o, n.Decode(&o)
}

func TestDecodeRefusalsNameTheKeyAndItsLine(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string
	}{
		{"an unknown top-level key", "name: a\nnmae: b\n", "nmae: unknown field (line 2)"},
		{"an unknown key in a nested mapping", "name: a\ninner:\n  zone: x\n  zonee: y\n", "inner.zonee: unknown field (line 4)"},
		{"an unknown key in a list item", "hosts:\n- zone: a\n- zon: b\n", "hosts[1].zon: unknown field (line 3)"},
		{"an unknown key in a map value", "labels:\n  eu: {zone: a, cnt: 1}\n", "labels[eu].cnt: unknown field (line 2)"},
		{"a list where a string goes", "name: [a]\n", "name: want a string, got array (line 1)"},
		{"text where an integer goes", "inner: {count: many}\n", "inner.count: want an integer, got string (line 1)"},
		{"a number where a string goes", "name: 12\n", "name: want a string, got number (line 1)"},
		{"a mapping where a list goes", "tags: {a: 1}\n", "tags: want a list, got object (line 1)"},
		{"text where a bool goes", "on: maybe\n", "on: want true or false, got string (line 1)"},
		{"a key set twice", "name: a\ninner: {}\nname: b\n", `line 3: key "name" already set in this mapping at line 1`},
		{"a key set twice deep down", "hosts:\n- zone: a\n  zone: b\n", `line 3: key "zone" already set`},
		{"a syntax error", "name: [a\n", "line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := decode(t, tt.yaml)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("decode = %+v, %v; want an error containing %q", o, err, tt.want)
			}
		})
	}
}

func TestDecodeAtNamesKeysFromThePath(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string
	}{
		{"an unknown key", "name: a\ninner: {zonee: x}\n", "gcp.inner.zonee: unknown field (line 2)"},
		{"the value itself of the wrong kind", "[a, b]\n", "gcp: want a mapping, got array (line 1)"},
		{"a value out of range", "inner: {count: 99999999999999999999}\n", "gcp.inner.count: want an integer, got number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			var o outer
			if err := n.DecodeAt("gcp", &o); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("DecodeAt = %+v, %v; want an error containing %q", o, err, tt.want)
			}
		})
	}
}

func TestDecodeFillsTheValue(t *testing.T) {
	yes := true
	tests := []struct {
		name string
		yaml string
		want outer
	}{
		{"every kind", "name: a\non: true\ntags: [x, 'y']\ninner: {zone: z, count: 3}\nhosts: [{zone: h}]\nlabels: {eu: {count: 1}}\n",
			outer{Name: "a", On: &yes, Tags: []string{"x", "y"}, Inner: inner{Zone: "z", Count: 3}, Hosts: []inner{{Zone: "h"}},
				Labels: map[string]inner{"eu": {Count: 1}}}},
		{"JSON is YAML", `{"name": "a", "tags": ["x"]}`, outer{Name: "a", Tags: []string{"x"}}},
		{"null leaves a field alone", "name: a\ninner: ~\ntags: null\n", outer{Name: "a"}},
		{"aliases and merge keys", "hosts:\n- &h {zone: z, count: 2}\n- {<<: *h, count: 5}\n",
			outer{Hosts: []inner{{Zone: "z", Count: 2}, {Zone: "z", Count: 5}}}},
		{"a date-like string stays as written", "name: 2026-01-02\n", outer{Name: "2026-01-02"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decode(t, tt.yaml)
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("decode = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestParseOfNothingIsANilNode(t *testing.T) {
	for _, in := range []string{"", "# only a comment\n", "\n\n"} {
		n, err := Parse([]byte(in))
		if err != nil || n != nil || !n.IsNull() {
			t.Fatalf("Parse(%q) = %v, %v; want a nil node that is null", in, n, err)
		}
		if _, ok := n.Mapping(); ok {
			t.Fatalf("Parse(%q): a nil node claims to be a mapping", in)
		}
	}
}

func TestMappingAndValueKeepFileOrderLinesAndPlainValues(t *testing.T) {
	n, err := Parse([]byte("b: 1\na: [x, 2]\nc: {d: true}\ne: 1.5\nf:\n"))
	if err != nil {
		t.Fatal(err)
	}
	entries, ok := n.Mapping()
	if !ok {
		t.Fatal("not a mapping")
	}
	var keys []string
	var lines []int
	got := map[string]any{}
	for _, e := range entries {
		keys, lines = append(keys, e.Key), append(lines, e.Line)
		if got[e.Key], err = e.Value.Value(); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(keys, []string{"b", "a", "c", "e", "f"}) || !reflect.DeepEqual(lines, []int{1, 2, 3, 4, 5}) {
		t.Errorf("keys %v at lines %v, want file order b a c e f at 1..5", keys, lines)
	}
	want := map[string]any{"b": 1, "a": []any{"x", 2}, "c": map[string]any{"d": true}, "e": 1.5, "f": nil}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("values %#v, want %#v", got, want)
	}
	if items, ok := entries[1].Value.Sequence(); !ok || len(items) != 2 || items[1].Line() != 2 {
		t.Errorf("a's items %v, %v; want two on line 2", items, ok)
	}
}

func TestABillionLaughsIsRefusedNotExpanded(t *testing.T) {
	var b strings.Builder
	b.WriteString("a: &a [x, x, x, x, x, x, x, x, x, x]\n")
	prev := "a"
	for _, name := range []string{"b", "c", "d", "e", "f", "g"} {
		b.WriteString(name + ": &" + name + " [" + strings.TrimSuffix(strings.Repeat("*"+prev+", ", 10), ", ") + "]\n")
		prev = name
	}
	n, err := Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Value(); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("Value = %v, want the size bound", err)
	}
	var o map[string]any
	if err := n.Decode(&o); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("Decode = %v, want the size bound", err)
	}
}
