package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/proxyfleet/proxyfleet/pool"
	"github.com/proxyfleet/proxyfleet/pool/leaseapi"
	"github.com/proxyfleet/proxyfleet/rotation"
)

const defaultLeaseAPI = "http://127.0.0.1:8090"

// leaseCommand is `proxyfleet lease`: the lease API for humans and scripts.
func leaseCommand() *cli.Command {
	return &cli.Command{
		Name:  "lease",
		Usage: "list, acquire, release and report upstream leases through a lease API",
		Description: "Talks to the lease API of a controller (--lease-api-listen) or a standalone gateway (--lease-api-listen).\n" +
			"Every subcommand takes --api, --token-file and --output.",
		Subcommands: []*cli.Command{
			leaseListCommand(),
			leaseAcquireCommand(),
			leaseReleaseCommand(),
			leaseReportCommand(),
		},
	}
}

// leaseAPIFlags are the flags every lease subcommand takes; defaultOutput is
// what suits the subcommand's reader (a table for people, JSON for scripts).
func leaseAPIFlags(defaultOutput string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{
			Name:    "api",
			Usage:   "base `URL` of the lease API",
			Value:   defaultLeaseAPI,
			EnvVars: []string{"PROXYFLEET_API"},
		},
		&cli.StringFlag{
			Name:    "token-file",
			Usage:   "`FILE` holding the API's bearer token (none: send no token)",
			EnvVars: []string{"PROXYFLEET_LEASE_API_TOKEN_FILE"},
		},
		&cli.StringFlag{
			Name:  "output",
			Usage: "output `FORMAT`: json or table",
			Value: defaultOutput,
		},
	}
}

func leaseListCommand() *cli.Command {
	return &cli.Command{
		Name:         "list",
		OnUsageError: usageError("lease list"),
		Usage:        "list the upstreams the API offers",
		ArgsUsage:    " ",
		Flags: append(leaseAPIFlags("table"),
			&cli.StringSliceFlag{Name: "attr", Usage: "only members with attribute `key=value` (repeatable)"},
			&cli.BoolFlag{Name: "healthy", Usage: "only members whose probes pass"},
		),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			client, out, err := leaseClient(c)
			if err != nil {
				return err
			}
			attrs, err := parsePairs("--attr", c.StringSlice("attr"))
			if err != nil {
				return err
			}
			proxies, err := client.List(c.Context, leaseapi.ListFilter{Attributes: attrs, HealthyOnly: c.Bool("healthy")})
			if err != nil {
				return leaseAPIError(c, err)
			}
			if out == "json" {
				return writeJSONTo(c.App.Writer, struct {
					Proxies []leaseapi.ProxyInfo `json:"proxies"`
					Count   int                  `json:"count"`
				}{proxies, len(proxies)})
			}
			return writeProxyTable(c.App.Writer, proxies, time.Now())
		},
	}
}

func leaseAcquireCommand() *cli.Command {
	return &cli.Command{
		Name:         "acquire",
		OnUsageError: usageError("lease acquire"),
		Usage:        "lease one upstream; prints the lease with the upstream's URL and credentials",
		ArgsUsage:    " ",
		Flags: append(leaseAPIFlags("json"),
			&cli.StringSliceFlag{Name: "selector", Usage: "attribute `key=value` the upstream must have (repeatable)"},
			&cli.StringFlag{Name: "target", Usage: "the site the lease is for (`HOST`[:port]); cooldowns are per target"},
			&cli.DurationFlag{Name: "ttl", Usage: "lease lifetime, a `DURATION` in whole seconds (0: the server's default)"},
			&cli.StringFlag{Name: "proxy", Usage: "lease the upstream called `NAME` only"},
		),
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			selector, err := parsePairs("--selector", c.StringSlice("selector"))
			if err != nil {
				return err
			}
			ttl := c.Duration("ttl")
			if ttl < 0 {
				return fmt.Errorf("invalid --ttl %s: must not be negative", ttl)
			}
			if ttl%time.Second != 0 {
				return fmt.Errorf("invalid --ttl %s: the lease API counts whole seconds", ttl)
			}
			client, out, err := leaseClient(c)
			if err != nil {
				return err
			}
			lease, err := client.Acquire(c.Context, pool.AcquireRequest{
				Selector: selector,
				Proxy:    c.String("proxy"),
				Target:   c.String("target"),
				TTL:      ttl,
			})
			if err != nil {
				if errors.Is(err, pool.ErrTTLTooLong) {
					return fmt.Errorf("--ttl %s: %w", ttl, err)
				}
				return leaseAPIError(c, err)
			}
			if out == "json" {
				return writeJSONTo(c.App.Writer, leaseapi.NewLeaseInfo(lease))
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LEASE\tPROXY\tURL\tTARGET\tEXPIRES")
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", lease.ID, lease.Member.Name, lease.Member.Redacted(),
				orDash(lease.Target), lease.ExpiresAt.Local().Format(time.RFC3339))
			return tw.Flush()
		},
	}
}

func leaseReleaseCommand() *cli.Command {
	return &cli.Command{
		Name:         "release",
		OnUsageError: usageError("lease release"),
		Usage:        "end a lease (releasing an unknown or expired lease is not an error)",
		ArgsUsage:    "LEASE_ID",
		Flags:        leaseAPIFlags("table"),
		Action: func(c *cli.Context) error {
			id, err := oneLeaseID(c)
			if err != nil {
				return err
			}
			client, out, err := leaseClient(c)
			if err != nil {
				return err
			}
			if err := client.Release(c.Context, id); err != nil {
				return leaseAPIError(c, err)
			}
			if out == "json" {
				return writeJSONTo(c.App.Writer, map[string]any{"leaseID": id, "released": true})
			}
			_, err = fmt.Fprintln(c.App.Writer, "released", id)
			return err
		},
	}
}

func leaseReportCommand() *cli.Command {
	return &cli.Command{
		Name:         "report",
		OnUsageError: usageError("lease report"),
		Usage:        "tell the pool how a leased upstream fared: ok, rate_limited, banned, upstream_failed, target_unreachable or answered",
		ArgsUsage:    "LEASE_ID",
		Flags: append(leaseAPIFlags("table"),
			&cli.StringFlag{Name: "result", Usage: "the `RESULT`: ok, rate_limited, banned, upstream_failed, target_unreachable or answered (required)"},
			&cli.StringFlag{Name: "target", Usage: "the site (`HOST`[:port]); empty: the lease's target"},
			&cli.DurationFlag{Name: "retry-after", Usage: "the site's Retry-After `DURATION`, when it sent one"},
		),
		Action: func(c *cli.Context) error {
			id, err := oneLeaseID(c)
			if err != nil {
				return err
			}
			if c.String("result") == "" {
				return errors.New("--result is required: ok, rate_limited, banned, upstream_failed, target_unreachable or answered")
			}
			result, err := rotation.ParseResult(c.String("result"))
			if err != nil {
				return fmt.Errorf("--result: %w", err)
			}
			retryAfter := c.Duration("retry-after")
			if retryAfter < 0 {
				return fmt.Errorf("invalid --retry-after %s: must not be negative", retryAfter)
			}
			client, out, err := leaseClient(c)
			if err != nil {
				return err
			}
			err = client.Report(c.Context, id, pool.Report{Result: result, Target: c.String("target"), RetryAfter: retryAfter})
			if err != nil {
				if errors.Is(err, pool.ErrUnknownLease) {
					return fmt.Errorf("lease %s: %w", id, err)
				}
				return leaseAPIError(c, err)
			}
			if out == "json" {
				return writeJSONTo(c.App.Writer, map[string]any{"leaseID": id, "result": result, "target": c.String("target")})
			}
			_, err = fmt.Fprintf(c.App.Writer, "reported %s for lease %s\n", result, id)
			return err
		},
	}
}

// leaseClient builds the API client from --api and --token-file and checks --output.
func leaseClient(c *cli.Context) (*leaseapi.Client, string, error) {
	out := c.String("output")
	if out != "json" && out != "table" {
		return nil, "", fmt.Errorf("invalid --output %q: want json or table", out)
	}
	var token string
	if f := c.String("token-file"); f != "" {
		var err error
		if token, err = readSingleToken("token-file", f); err != nil {
			return nil, "", err
		}
	}
	client, err := leaseapi.NewClient(c.String("api"), token, nil)
	if err != nil {
		return nil, "", fmt.Errorf("invalid --api: %w", err)
	}
	return client, out, nil
}

// leaseAPIError points at the flag most likely to fix an API failure.
func leaseAPIError(c *cli.Context, err error) error {
	var apiErr *leaseapi.APIError
	switch {
	case errors.Is(err, pool.ErrUnreachable):
		return fmt.Errorf("%w (is --api %s right, and the server running?)", err, c.String("api"))
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusUnauthorized:
		return fmt.Errorf("%w (check --token-file)", err)
	}
	return err
}

// positionalArgs returns the positional arguments after applying any flags
// written after them (`report ID --result banned`): urfave/cli v2 stops
// parsing flags at the first positional argument and would leave them unread.
func positionalArgs(c *cli.Context) ([]string, error) {
	args := c.Args().Slice()
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := findFlag(c.Command.Flags, name)
		if f == nil {
			return nil, fmt.Errorf("unknown flag %s (see --help)", a)
		}
		if !hasVal {
			if _, isBool := f.(*cli.BoolFlag); isBool {
				val = "true"
			} else {
				if i+1 >= len(args) {
					return nil, fmt.Errorf("flag --%s needs a value", name)
				}
				i++
				val = args[i]
			}
		}
		if err := c.Set(name, val); err != nil {
			return nil, fmt.Errorf("invalid --%s %q: %w", name, val, err)
		}
	}
	return pos, nil
}

func findFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

func noArgs(c *cli.Context) error {
	pos, err := positionalArgs(c)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%s takes no arguments, got %q", c.Command.Name, pos[0])
	}
	return nil
}

func oneLeaseID(c *cli.Context) (string, error) {
	pos, err := positionalArgs(c)
	if err != nil {
		return "", err
	}
	switch len(pos) {
	case 0:
		return "", fmt.Errorf("%s needs a LEASE_ID argument", c.Command.Name)
	case 1:
		if pos[0] != "" {
			return pos[0], nil
		}
		return "", errors.New("LEASE_ID is empty")
	}
	return "", fmt.Errorf("%s takes one LEASE_ID, got %d arguments", c.Command.Name, len(pos))
}

// parsePairs turns repeated key=value flag values into a map, naming the flag on error.
func parsePairs(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("invalid %s %q: want key=value", flag, v)
		}
		if prev, dup := m[k]; dup && prev != val {
			return nil, fmt.Errorf("invalid %s: %q given twice with different values", flag, k)
		}
		m[k] = val
	}
	return m, nil
}

func writeJSONTo(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func writeProxyTable(w io.Writer, proxies []leaseapi.ProxyInfo, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tURL\tHEALTHY\tLATENCY\tLEASES\tCOOLDOWNS\tATTRIBUTES")
	for _, p := range proxies {
		latency := "-"
		if p.LatencyMillis > 0 {
			latency = fmt.Sprintf("%dms", p.LatencyMillis)
		}
		cooldowns := make([]string, 0, len(p.Cooldowns))
		for _, cd := range p.Cooldowns {
			target := cd.Target
			if target == "" {
				target = "*"
			}
			cooldowns = append(cooldowns, fmt.Sprintf("%s(%s)", target, cd.Until.Sub(now).Round(time.Second)))
		}
		attrs := make([]string, 0, len(p.Attributes))
		for k, v := range p.Attributes {
			attrs = append(attrs, k+"="+v)
		}
		sort.Strings(attrs)
		fmt.Fprintf(tw, "%s\t%s\t%t\t%s\t%d\t%s\t%s\n", p.Name, p.URL, p.Healthy, latency, p.ActiveLeases,
			orDash(strings.Join(cooldowns, ",")), orDash(strings.Join(attrs, ",")))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
