// Package strictyaml is the one strict YAML reader of proxyfleet's files
// (the providers config, the commands' --config files). Parse reads one
// document and refuses a key given twice in a mapping; a Node's Decode fills
// a Go value by its json tags and refuses keys the type does not have and
// values of the wrong kind. Every error names the key (its dotted path) and
// its line, so an operator can find the typo.
//
// It reads YAML 1.2 through gopkg.in/yaml.v3, whose node tree keeps the line
// of every key; decoding goes through encoding/json so that the json tags the
// config types already carry are the only field names.
//
// It imports yaml.v3 only, nothing of proxyfleet.
package strictyaml

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxNodes bounds how many nodes one Decode or Value visits, aliases
// expanded: a few aliases of aliases (a "billion laughs" file) would
// otherwise expand into more values than memory holds.
const maxNodes = 100_000

// errTooLarge is returned past maxNodes.
var errTooLarge = fmt.Errorf("the document expands to more than %d values (aliases of aliases?)", maxNodes)

// Node is one parsed YAML value and where it is in the file.
type Node struct {
	n *yaml.Node
}

// Entry is one key of a mapping: the key, its line and its value.
type Entry struct {
	// Key is the key as written.
	Key string
	// Line is the key's line, for error messages.
	Line int
	// Value is what the key maps to.
	Value *Node
}

// Parse parses the first YAML document of data. A syntax error, or a key
// given twice in one mapping, is an error naming the line. An empty
// document (nothing, or only comments) is a nil *Node.
func Parse(data []byte) (*Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, nil
	}
	root := doc.Content[0]
	budget := maxNodes
	if err := checkDuplicates(root, &budget); err != nil {
		return nil, err
	}
	return &Node{n: root}, nil
}

// checkDuplicates walks the tree (aliases are checked where they are
// defined) and names the first key set twice in a mapping.
func checkDuplicates(n *yaml.Node, budget *int) error {
	if *budget--; *budget < 0 {
		return errTooLarge
	}
	switch n.Kind {
	case yaml.MappingNode:
		first := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Tag != "!!merge" {
				if line, dup := first[k.Value]; dup {
					return fmt.Errorf("line %d: key %q already set in this mapping at line %d", k.Line, k.Value, line)
				}
				first[k.Value] = k.Line
			}
			if err := checkDuplicates(n.Content[i+1], budget); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if err := checkDuplicates(c, budget); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// Line is the line the value starts on.
func (n *Node) Line() int {
	if n == nil {
		return 0
	}
	return n.n.Line
}

// IsNull reports whether the value is absent or null (~, null, nothing).
func (n *Node) IsNull() bool {
	if n == nil {
		return true
	}
	r := resolve(n.n)
	return r == nil || (r.Kind == yaml.ScalarNode && r.Tag == "!!null")
}

// Mapping returns a mapping's entries in file order, merge keys (<<)
// expanded; ok is false when the value is not a mapping (or its merge keys
// expand past the size bound).
func (n *Node) Mapping() (entries []Entry, ok bool) {
	if n == nil {
		return nil, false
	}
	r := resolve(n.n)
	if r.Kind != yaml.MappingNode {
		return nil, false
	}
	budget := maxNodes
	entries, err := mappingEntries(r, &budget)
	return entries, err == nil
}

// mappingEntries lists r's keys; a merged mapping's keys come after r's
// own and never override them, as YAML's merge key says.
func mappingEntries(r *yaml.Node, budget *int) ([]Entry, error) {
	if *budget--; *budget < 0 {
		return nil, errTooLarge
	}
	var own, merged []Entry
	seen := map[string]bool{}
	for i := 0; i+1 < len(r.Content); i += 2 {
		k, v := r.Content[i], r.Content[i+1]
		if k.Tag == "!!merge" {
			for _, m := range mergeSources(v) {
				more, err := mappingEntries(m, budget)
				if err != nil {
					return nil, err
				}
				merged = append(merged, more...)
			}
			continue
		}
		seen[k.Value] = true
		own = append(own, Entry{Key: k.Value, Line: k.Line, Value: &Node{n: v}})
	}
	for _, e := range merged {
		if !seen[e.Key] {
			seen[e.Key] = true
			own = append(own, e)
		}
	}
	return own, nil
}

// mergeSources are the mappings a merge key names: one, or a list of them.
func mergeSources(v *yaml.Node) []*yaml.Node {
	v = resolve(v)
	switch v.Kind {
	case yaml.MappingNode:
		return []*yaml.Node{v}
	case yaml.SequenceNode:
		var out []*yaml.Node
		for _, c := range v.Content {
			if c = resolve(c); c.Kind == yaml.MappingNode {
				out = append(out, c)
			}
		}
		return out
	}
	return nil
}

// Sequence returns a list's items; ok is false when the value is not a list.
func (n *Node) Sequence() (items []*Node, ok bool) {
	if n == nil {
		return nil, false
	}
	r := resolve(n.n)
	if r.Kind != yaml.SequenceNode {
		return nil, false
	}
	for _, c := range r.Content {
		items = append(items, &Node{n: c})
	}
	return items, true
}

// Value returns the value as plain Go values: nil, bool, int, float64,
// string, []any and map[string]any (for a value whose type a caller checks
// itself, such as a command's flag values).
func (n *Node) Value() (any, error) {
	if n == nil {
		return nil, nil
	}
	budget := maxNodes
	return plain(n.n, &budget)
}

// Decode fills v, a non-nil pointer, from the value by v's json tags. A key
// v's type does not have is an error "path: unknown field (line N)"; a value
// of the wrong kind "path: want a string, got array (line N)". Keys match
// the tags exactly (no case folding), and null leaves a field as it is.
func (n *Node) Decode(v any) error { return n.DecodeAt("", v) }

// DecodeAt is Decode for a value found at path in a larger document (a
// block under its key): every error names the key's path from there
// ("gcp.defaults.zonee: unknown field (line 9)", "gcp: want a mapping, got
// string (line 4)").
func (n *Node) DecodeAt(path string, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("strictyaml: Decode needs a non-nil pointer, got %T", v)
	}
	if n == nil {
		return nil
	}
	budget := maxNodes
	if err := check(n.n, rv.Type().Elem(), path, &budget); err != nil {
		return err
	}
	budget = maxNodes
	val, err := plain(n.n, &budget)
	if err != nil {
		return err
	}
	js, err := json.Marshal(val)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(string(js)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		// check has seen every key and kind; what is left is a value out
		// of range, such as an integer too large for its field.
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%s: want %s, got %s", orValue(join(path, te.Field)), describe(te.Type), te.Value)
		}
		return err
	}
	return nil
}

// check walks the node against t and names the first unknown key or value
// of the wrong kind, with its path and line.
func check(n *yaml.Node, t reflect.Type, path string, budget *int) error {
	if *budget--; *budget < 0 {
		return errTooLarge
	}
	n = resolve(n)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if t.Kind() == reflect.Interface {
		return nil
	}
	if got, ok := kindOK(n, t); !ok {
		return fmt.Errorf("%s: want %s, got %s (line %d)", orValue(path), describe(t), got, n.Line)
	}
	switch t.Kind() {
	case reflect.Struct:
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name != "" && name != "-" && f.IsExported() {
				fields[name] = f.Type
			}
		}
		entries, err := mappingEntries(n, budget)
		if err != nil {
			return err
		}
		for _, e := range entries {
			ft, ok := fields[e.Key]
			if !ok {
				return fmt.Errorf("%s: unknown field (line %d)", join(path, e.Key), e.Line)
			}
			if err := check(e.Value.n, ft, join(path, e.Key), budget); err != nil {
				return err
			}
		}
	case reflect.Map:
		entries, err := mappingEntries(n, budget)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := check(e.Value.n, t.Elem(), fmt.Sprintf("%s[%s]", path, e.Key), budget); err != nil {
				return err
			}
		}
	case reflect.Slice:
		for i, c := range n.Content {
			if err := check(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), budget); err != nil {
				return err
			}
		}
	}
	return nil
}

// kindOK reports whether n can fill a value of type t, and else n's kind in
// the words encoding/json uses (array, object, number, string, bool).
func kindOK(n *yaml.Node, t reflect.Type) (got string, ok bool) {
	got = kindName(n)
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return got, n.Kind == yaml.MappingNode
	case reflect.Slice, reflect.Array:
		return got, n.Kind == yaml.SequenceNode
	case reflect.String:
		return got, got == "string"
	case reflect.Bool:
		return got, got == "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return got, n.Kind == yaml.ScalarNode && n.Tag == "!!int"
	case reflect.Float32, reflect.Float64:
		return got, got == "number"
	}
	return got, true
}

// kindName names a node's kind as encoding/json's type errors do.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "object"
	case yaml.SequenceNode:
		return "array"
	}
	switch n.Tag {
	case "!!int", "!!float":
		return "number"
	case "!!bool":
		return "bool"
	case "!!null":
		return "null"
	}
	return "string"
}

// plain converts the node to plain Go values, aliases and merge keys
// expanded.
func plain(n *yaml.Node, budget *int) (any, error) {
	if *budget--; *budget < 0 {
		return nil, errTooLarge
	}
	n = resolve(n)
	switch n.Kind {
	case yaml.MappingNode:
		entries, err := mappingEntries(n, budget)
		if err != nil {
			return nil, err
		}
		out := map[string]any{}
		for _, e := range entries {
			v, err := plain(e.Value.n, budget)
			if err != nil {
				return nil, err
			}
			out[e.Key] = v
		}
		return out, nil
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := plain(c, budget)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	switch n.Tag {
	case "!!null":
		return nil, nil
	case "!!bool", "!!int", "!!float":
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
		if f, ok := v.(float64); ok && (math.IsInf(f, 0) || math.IsNaN(f)) {
			return nil, fmt.Errorf("line %d: %s is not a finite number", n.Line, strconv.Quote(n.Value))
		}
		if _, big := v.(uint64); big {
			return json.Number(strconv.FormatUint(v.(uint64), 10)), nil
		}
		return v, nil
	}
	// Strings, and tags such as !!timestamp or !!binary, as written.
	return n.Value, nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orValue(path string) string {
	if path == "" {
		return "the value"
	}
	return path
}

// describe names what a Go type takes, for error messages.
func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		return "a mapping"
	}
	return t.String()
}
