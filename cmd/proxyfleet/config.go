package main

import (
	"bufio"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/proxyfleet/proxyfleet/gateway/clients"
	"github.com/proxyfleet/proxyfleet/internal/strictyaml"
)

// envPrefix starts every environment variable a proxyfleet flag reads.
const envPrefix = "PROXYFLEET_"

// envVar is the environment variable of a flag: PROXYFLEET_ and the flag
// name in upper snake case (--lease-ttl → PROXYFLEET_LEASE_TTL).
func envVar(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// formerNames are the flags renamed so that one idea has one name (the lease
// API is "lease-api" in every flag of both commands), each with the name it
// had. The former name keeps working for one release: on the command line,
// as its environment variable and as a --config key; --help lists it beside
// the new name, and docs/operations.md names every pair. The map is keyed
// by name, not by command: --api-listen also reaches the controller's
// --lease-api-listen, which is the same setting.
var formerNames = map[string]string{
	"lease-api":            "pool-api",
	"lease-api-listen":     "api-listen",
	"lease-api-token-file": "api-token-file",
	"sidecar-lease-api":    "sidecar-pool-api",
}

// aliases are a flag's former names (formerNames).
func aliases(name string) []string {
	if old, ok := formerNames[name]; ok {
		return []string{old}
	}
	return nil
}

// envVars are the environment variables a flag reads: its own first, then
// its former name's, so the new one wins when both are set.
func envVars(name string) []string {
	vs := []string{envVar(name)}
	for _, a := range aliases(name) {
		vs = append(vs, envVar(a))
	}
	return vs
}

// The flag constructors every command uses: each flag reads its
// environment variables (envVars) and, through its altsrc wrapper, its key in
// the command's --config file, under its former name too (aliases). A flag built any other way would pass the
// file's key check and then be silently ignored (the every-flag tests catch
// that).

// stringFlag is a string flag with a default.
func stringFlag(name, value, usage string) cli.Flag {
	return altsrc.NewStringFlag(&cli.StringFlag{Name: name, Aliases: aliases(name), Value: value, Usage: usage, EnvVars: envVars(name)})
}

// pathFlag is a file or directory flag; a relative path in the --config
// file is read relative to that file.
func pathFlag(name, usage string) cli.Flag {
	return altsrc.NewPathFlag(&cli.PathFlag{Name: name, Aliases: aliases(name), Usage: usage, EnvVars: envVars(name), TakesFile: true})
}

// listFlag is a repeatable string flag.
func listFlag(name, usage string) cli.Flag {
	return altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: name, Aliases: aliases(name), Usage: usage, EnvVars: envVars(name)})
}

// durationFlag is a duration flag whose default is written as --help shows
// it: "60s" stays 60s, not the 1m0s Go would print (the README's flag
// table repeats the gateway's); a default that is a Go value is given as
// its String.
func durationFlag(name, value, usage string) cli.Flag {
	d, err := time.ParseDuration(value)
	if err != nil {
		panic("flag --" + name + ": bad default " + value) // a typo in a flag list, caught by every test
	}
	return altsrc.NewDurationFlag(&cli.DurationFlag{Name: name, Aliases: aliases(name), Value: d, DefaultText: value, Usage: usage, EnvVars: envVars(name)})
}

// intFlag is an integer flag with a default.
func intFlag(name string, value int, usage string) cli.Flag {
	return altsrc.NewIntFlag(&cli.IntFlag{Name: name, Aliases: aliases(name), Value: value, Usage: usage, EnvVars: envVars(name)})
}

// boolFlag is a flag that is off by default.
func boolFlag(name, usage string) cli.Flag {
	return altsrc.NewBoolFlag(&cli.BoolFlag{Name: name, Aliases: aliases(name), Usage: usage, EnvVars: envVars(name)})
}

// configFileFlag is --config itself: read from the command line or the
// environment only, never from a file.
func configFileFlag() cli.Flag {
	return &cli.PathFlag{Name: flagConfig, Usage: "YAML `FILE` of flag values (keys are flag names without dashes)", EnvVars: []string{envVar(flagConfig)}, TakesFile: true}
}

// yamlConfig returns the altsrc input source for a command's --config file.
// Its keys are the command's flag names without dashes; an unknown key or a
// value of the wrong shape is an error naming the key, and a missing file is
// an error. Without --config it is an empty source.
func yamlConfig(configFlag string, flags []cli.Flag) func(*cli.Context) (altsrc.InputSourceContext, error) {
	return func(c *cli.Context) (altsrc.InputSourceContext, error) {
		path := c.String(configFlag)
		if path == "" {
			return altsrc.NewMapInputSource("", map[any]any{}), nil
		}
		values, err := loadYAMLConfig(path, configFlag, flags)
		if err != nil {
			return nil, err
		}
		return altsrc.NewMapInputSource(path, values), nil
	}
}

// initConfigFile is a command's Before: it applies the --config file to every
// flag that neither the command line nor the environment set, so the
// precedence is flag > env > file > default.
func initConfigFile(configFlag string, flags []cli.Flag) cli.BeforeFunc {
	source := yamlConfig(configFlag, flags)
	return func(c *cli.Context) error {
		src, err := source(c)
		if err != nil {
			return err
		}
		if err := altsrc.ApplyInputSourceValues(c, src, flags); err != nil {
			return fmt.Errorf("--%s %s: %w", configFlag, src.Source(), err)
		}
		return nil
	}
}

// loadYAMLConfig reads a config file into the map altsrc expects, checking
// every key against flags and normalising values to the flag's type (a YAML
// number for a string flag, one string for a list flag). Errors name the
// key and its line.
func loadYAMLConfig(path, configFlag string, flags []cli.Flag) (map[any]any, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", configFlag, err)
	}
	root, err := strictyaml.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", configFlag, path, err)
	}
	entries, ok := root.Mapping()
	if !ok && !root.IsNull() {
		return nil, fmt.Errorf("--%s %s: not a YAML mapping of flag names to values (line %d)", configFlag, path, root.Line())
	}
	byName := map[string]cli.Flag{}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != configFlag && n != "help" {
				byName[n] = f
			}
		}
	}
	var unknown []strictyaml.Entry
	for _, e := range entries {
		if _, ok := byName[e.Key]; !ok {
			unknown = append(unknown, e)
		}
	}
	if len(unknown) > 0 {
		sort.Slice(unknown, func(i, j int) bool { return unknown[i].Key < unknown[j].Key })
		keys, lines := make([]string, len(unknown)), make([]string, len(unknown))
		for i, e := range unknown {
			keys[i], lines[i] = e.Key, strconv.Itoa(e.Line)
		}
		at := "line "
		if len(lines) > 1 {
			at = "lines "
		}
		return nil, fmt.Errorf("--%s %s: unknown key %s (%s%s; keys are flag names without the dashes, e.g. lease-ttl)",
			configFlag, path, quoteList(keys), at, strings.Join(lines, ", "))
	}
	out := make(map[any]any, len(entries))
	for _, e := range entries {
		v, err := e.Value.Value()
		if err == nil {
			v, err = normaliseConfigValue(byName[e.Key], v)
		}
		if err != nil {
			return nil, fmt.Errorf("--%s %s: key %q (line %d): %w", configFlag, path, e.Key, e.Line, err)
		}
		out[e.Key] = v
	}
	return out, nil
}

// normaliseConfigValue converts a decoded YAML value to what altsrc reads for
// the flag's type, or says what was expected.
func normaliseConfigValue(f cli.Flag, v any) (any, error) {
	switch f.(type) {
	case *altsrc.StringFlag, *altsrc.PathFlag:
		switch x := v.(type) {
		case nil:
			return "", nil
		case []any:
			// A list for a comma-separated flag: rate-limit-status: [429, 503].
			parts := make([]string, 0, len(x))
			for _, e := range x {
				s, ok := scalarString(e)
				if !ok {
					return nil, fmt.Errorf("want a string or a list of scalars, got a nested %T", e)
				}
				parts = append(parts, s)
			}
			return strings.Join(parts, ","), nil
		default:
			s, ok := scalarString(v)
			if !ok {
				return nil, fmt.Errorf("want a string, got %s", yamlKind(v))
			}
			return s, nil
		}
	case *altsrc.StringSliceFlag:
		switch x := v.(type) {
		case []any:
			out := make([]any, 0, len(x))
			for _, e := range x {
				s, ok := scalarString(e)
				if !ok {
					return nil, fmt.Errorf("want a list of strings, got an item that is %s", yamlKind(e))
				}
				out = append(out, s)
			}
			return out, nil
		default:
			s, ok := scalarString(v)
			if !ok {
				return nil, fmt.Errorf("want a string or a list of strings, got %s", yamlKind(v))
			}
			return []any{s}, nil
		}
	case *altsrc.DurationFlag:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("want a duration with a unit such as 30s or 10m, got %s", yamlKind(v))
		}
		if _, err := time.ParseDuration(s); err != nil {
			return nil, fmt.Errorf("want a duration with a unit such as 30s or 10m: %w", err)
		}
		return s, nil
	case *altsrc.IntFlag:
		switch x := v.(type) {
		case int:
			return x, nil
		case float64:
			if x == math.Trunc(x) && math.Abs(x) < math.MaxInt32 {
				return int(x), nil
			}
		case string:
			if n, err := strconv.Atoi(strings.TrimSpace(x)); err == nil {
				return n, nil
			}
		}
		return nil, fmt.Errorf("want an integer, got %s", yamlKind(v))
	case *altsrc.BoolFlag:
		if b, ok := v.(bool); ok {
			return b, nil
		}
		return nil, fmt.Errorf("want true or false, got %s", yamlKind(v))
	}
	return v, nil
}

// scalarString renders a YAML scalar as the string a flag would take.
func scalarString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case int:
		return strconv.Itoa(x), true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}

// yamlKind names a decoded value's shape for error messages.
func yamlKind(v any) string {
	switch x := v.(type) {
	case nil:
		return "nothing"
	case string:
		return strconv.Quote(x)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	case bool, int, float64:
		return fmt.Sprint(x)
	}
	return fmt.Sprintf("a %T", v)
}

func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = strconv.Quote(x)
	}
	return strings.Join(q, ", ")
}

// readTokenFile reads client tokens: one per line, blank lines and lines
// starting with # ignored. A file without any token is an error, because an
// empty token list would silently mean "no authentication".
func readTokenFile(flagName, path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagName, err)
	}
	defer f.Close()
	var tokens []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		tokens = append(tokens, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flagName, path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("--%s %s holds no token (want one token per line; # starts a comment)", flagName, path)
	}
	return tokens, nil
}

// readClientsFile reads the gateway's token clients (clients.Parse); its
// errors name the flag, the file and the line, never a token.
func readClientsFile(flagName, path string) ([]clients.Client, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagName, err)
	}
	defer f.Close()
	cs, err := clients.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flagName, path, err)
	}
	return cs, nil
}

// readSingleToken reads a bearer token file for a client or server that
// takes exactly one token: the same format as readTokenFile, so one file
// serves the gateway's --lease-api-token-file and the lease CLI's --token-file.
func readSingleToken(flagName, path string) (string, error) {
	tokens, err := readTokenFile(flagName, path)
	if err != nil {
		return "", err
	}
	if len(tokens) != 1 {
		return "", fmt.Errorf("--%s %s holds %d tokens; want exactly one", flagName, path, len(tokens))
	}
	return tokens[0], nil
}

// checkListenAddr validates a host:port flag value and reports whether it
// binds only to loopback. An empty host (":3128") is every interface; a
// host name other than localhost is not trusted to be loopback.
func checkListenAddr(flagName, addr string) (loopback bool, err error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("--%s %q: want host:port: %w", flagName, addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		if _, lerr := net.LookupPort("tcp", port); lerr != nil {
			return false, fmt.Errorf("--%s %q: invalid port %q", flagName, addr, port)
		}
	}
	if strings.EqualFold(host, "localhost") {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// logFlags are --log-level and --log-format, the same on every command
// but for the format's default: text for the gateway (read by a person at
// a terminal, often), json for the controller (read by a cluster's log
// pipeline).
func logFlags(defaultFormat string) []cli.Flag {
	return []cli.Flag{
		stringFlag(flagLogLevel, "info", "`LEVEL`: debug, info, warn or error"),
		stringFlag(flagLogFormat, defaultFormat, "`FORMAT`: text or json"),
	}
}

// readLogFlags reads logFlags: the level, and whether records are JSON.
func readLogFlags(c *cli.Context) (level slog.Level, json bool, err error) {
	if err := level.UnmarshalText([]byte(c.String(flagLogLevel))); err != nil {
		return level, false, fmt.Errorf("--%s %q: want debug, info, warn or error", flagLogLevel, c.String(flagLogLevel))
	}
	switch f := c.String(flagLogFormat); f {
	case "text":
		return level, false, nil
	case "json":
		return level, true, nil
	default:
		return level, false, fmt.Errorf("--%s %q: want text or json", flagLogFormat, f)
	}
}
