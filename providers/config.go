package providers

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/proxyfleet/proxyfleet/internal/strictyaml"
)

// Config is the providers config file: named provider entries that
// Proxy.spec.provider refers to.
type Config struct {
	Providers []Entry
}

// Entry is one configured provider: a name, a type, and the block of
// settings under the key the type names. The block is kept as read, not
// decoded: it belongs to the type's package, which reads and validates it
// with Decode. This package knows no type's settings.
type Entry struct {
	// Name is what Proxy.spec.provider names; a DNS-1123 label, unique in the file.
	Name string
	// Type selects the backend, and is the key of the entry's block.
	Type string
	// block is the value under the key Type; nil when there is none.
	block *strictyaml.Node
}

// Decode fills v, a non-nil pointer, from the block of an entry of type
// typ by v's json tags, strictly: an unknown key or a value of the wrong
// kind is an error naming the key's path from the block's key and its line
// ("kvm.hosts[0].nmae: unknown field (line 9)"). An entry of another type is
// an error; one without a block leaves v as it is.
func (e Entry) Decode(typ string, v any) error {
	if e.Type != typ {
		return fmt.Errorf("entry %q is of type %q, not %s", e.Name, e.Type, typ)
	}
	return e.block.DecodeAt(e.Type, v)
}

// Decoder reads and validates the block of one type's entries, as that
// type's package does, without building anything: ParseConfig runs it on
// every entry of the type, so a broken file fails before anything connects.
// It returns every problem it finds, several as an errors.Join of one error
// each, each naming its field from the block's key ("gcp.project is
// required"). The binary's composition root maps each type it carries to
// its Decoder; this package holds none.
type Decoder func(Entry) error

// Problems is what a Decoder returns for the problems it found: sorted (a
// block's maps have no order), each an error of its own, nil for none.
func Problems(list []string) error {
	sorted := slices.Sorted(slices.Values(list))
	errs := make([]error, 0, len(sorted))
	for _, p := range sorted {
		errs = append(errs, errors.New(p))
	}
	return errors.Join(errs...)
}

// DecoderOf is the Decoder of a provider package's typed config reader
// (such as kvm.ReadConfig), which its constructor reads the entry with too.
func DecoderOf[C any](read func(Entry) (C, error)) Decoder {
	return func(e Entry) error {
		_, err := read(e)
		return err
	}
}

// LoadConfig reads and validates the providers config file at path; types
// are the provider types the file may name, each with its Decoder.
func LoadConfig(path string, types map[string]Decoder) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("providers config: %w", err)
	}
	cfg, err := ParseConfig(data, types)
	if err != nil {
		return Config{}, fmt.Errorf("providers config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes YAML (or JSON) strictly — unknown and duplicate keys are
// errors — and validates the result: the names, that each entry's type is one
// of types and carries that type's block and no other, and each block with its
// type's Decoder. Every problem of every entry is reported, each prefixed with
// the entry ("providers[1] (gcp-eu): gcp.project is required"), a decoding
// error with its line.
func ParseConfig(data []byte, types map[string]Decoder) (Config, error) {
	raw, err := entryNodes(data)
	if err != nil {
		return Config{}, err
	}
	var (
		cfg    Config
		others [][]string
		errs   []error
	)
	for i, r := range raw {
		e, other, err := decodeEntry(r, types)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", entryLabel(i, peekName(r)), err))
			continue
		}
		cfg.Providers = append(cfg.Providers, e)
		others = append(others, other)
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	names := checkNames(cfg.Providers)
	for i, e := range cfg.Providers {
		for _, p := range append(names[i], checkType(e, others[i], types)...) {
			errs = append(errs, fmt.Errorf("%s: %w", entryLabel(i, e.Name), p))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// entryNodes returns the items of the file's one key, providers.
func entryNodes(data []byte) ([]*strictyaml.Node, error) {
	root, err := strictyaml.Parse(data)
	if err != nil || root.IsNull() {
		return nil, err
	}
	top, ok := root.Mapping()
	if !ok {
		return nil, errors.New("the file must be a mapping with a providers list")
	}
	var list *strictyaml.Node
	for _, e := range top {
		if e.Key != "providers" {
			return nil, fmt.Errorf("unknown field %q (line %d; the file has one key, providers)", e.Key, e.Line)
		}
		list = e.Value
	}
	if list.IsNull() {
		return nil, nil
	}
	items, ok := list.Sequence()
	if !ok {
		return nil, fmt.Errorf("providers must be a list of entries (line %d)", list.Line())
	}
	return items, nil
}

// decodeEntry reads one entry's name and type, keeps the block of its type,
// and returns the keys of the other types' blocks it carries (refused by
// checkType). A key that is neither name, type nor a type of types is an
// unknown field, reported with its line.
func decodeEntry(r *strictyaml.Node, types map[string]Decoder) (e Entry, others []string, err error) {
	keys, ok := r.Mapping()
	if !ok {
		return Entry{}, nil, fmt.Errorf("an entry must be a mapping (line %d)", r.Line())
	}
	blocks := map[string]*strictyaml.Node{}
	for _, k := range keys {
		switch _, known := types[k.Key]; {
		case k.Key == "name":
			err = k.Value.DecodeAt(k.Key, &e.Name)
		case k.Key == "type":
			err = k.Value.DecodeAt(k.Key, &e.Type)
		case known:
			if !k.Value.IsNull() {
				blocks[k.Key] = k.Value
			}
		default:
			err = fmt.Errorf("%s: unknown field (line %d)", k.Key, k.Line)
		}
		if err != nil {
			return Entry{}, nil, err
		}
	}
	e.block = blocks[e.Type]
	for _, t := range slices.Sorted(maps.Keys(blocks)) {
		if t != e.Type {
			others = append(others, t)
		}
	}
	return e, others, nil
}

// peekName reads an entry's name leniently, for error messages.
func peekName(r *strictyaml.Node) string {
	entries, _ := r.Mapping()
	for _, e := range entries {
		if e.Key == "name" {
			v, _ := e.Value.Value()
			s, _ := v.(string)
			return s
		}
	}
	return ""
}

func entryLabel(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("providers[%d]", i)
	}
	return fmt.Sprintf("providers[%d] (%s)", i, name)
}

// checkNames checks that every entry has a name that is a DNS-1123 label
// and unique in the list: the problems of entries[i] are in [i].
func checkNames(entries []Entry) [][]error {
	out := make([][]error, len(entries))
	seen := map[string]int{}
	for i, e := range entries {
		if e.Name == "" {
			out[i] = append(out[i], errors.New("name is required"))
			continue
		}
		if msgs := validation.IsDNS1123Label(e.Name); len(msgs) > 0 {
			out[i] = append(out[i], fmt.Errorf("name %q is not a DNS-1123 label: %s", e.Name, strings.Join(msgs, "; ")))
		}
		if j, dup := seen[e.Name]; dup {
			out[i] = append(out[i], fmt.Errorf("name %q is already used by providers[%d]", e.Name, j))
		} else {
			seen[e.Name] = i
		}
	}
	return out
}

// checkType checks e's type against types, that e carries the type's block
// and none of others, and then the block with the type's Decoder.
func checkType(e Entry, others []string, types map[string]Decoder) []error {
	var errs []error
	known := strings.Join(slices.Sorted(maps.Keys(types)), ", ")
	decode, ok := types[e.Type]
	switch {
	case e.Type == "":
		errs = append(errs, fmt.Errorf("type is required (one of %s)", known))
	case !ok:
		errs = append(errs, fmt.Errorf("type %q is unknown (want one of %s)", e.Type, known))
	case e.block == nil:
		errs = append(errs, fmt.Errorf("%s block is required for type %s", e.Type, e.Type))
	}
	for _, t := range others {
		errs = append(errs, fmt.Errorf("%s block is not allowed for type %q", t, e.Type))
	}
	if ok && e.block != nil && decode != nil {
		errs = append(errs, problems(decode(e))...)
	}
	return errs
}

// problems splits a Decoder's answer into its problems: the errors of an
// errors.Join one by one, else the one error.
func problems(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
