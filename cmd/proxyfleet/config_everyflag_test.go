package main

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"
)

// TestEveryGatewayFlagIsReadFromTheConfigFile sets every gateway flag (but
// --config) in one YAML file and checks that each one arrives in the
// command's context. A flag added without its altsrc wrapper would pass the
// key check of the file and then be silently ignored; this catches it.
func TestEveryGatewayFlagIsReadFromTheConfigFile(t *testing.T) {
	checkEveryFlagIsReadFromTheConfigFile(t, gatewayCommand())
}

// checkEveryFlagIsReadFromTheConfigFile writes one YAML file setting every
// flag of cmd but --config and runs cmd with it, its Action replaced so that
// nothing is validated or started: each flag must then be set.
func checkEveryFlagIsReadFromTheConfigFile(t *testing.T, cmd *cli.Command) {
	t.Helper()
	var yaml strings.Builder
	var names []string
	for _, f := range cmd.Flags {
		name := f.Names()[0]
		if name == flagConfig {
			continue
		}
		names = append(names, name)
		var v string
		switch f.(type) {
		case *altsrc.DurationFlag:
			v = "7s"
		case *altsrc.IntFlag:
			v = "7"
		case *altsrc.BoolFlag:
			v = "true"
		case *altsrc.StringSliceFlag:
			v = "[a, b]"
		case *altsrc.StringFlag, *altsrc.PathFlag:
			v = "/from-yaml"
		default:
			t.Errorf("--%s is a %T, not an altsrc flag: the --config file cannot set it", name, f)
			continue
		}
		fmt.Fprintf(&yaml, "%s: %s\n", name, v)
	}
	config := writeFile(t, "every-flag.yaml", yaml.String())

	set := map[string]bool{}
	cmd.Action = func(c *cli.Context) error { // the flag values only; no validation, nothing starts
		for _, n := range names {
			set[n] = c.IsSet(n)
		}
		return nil
	}
	app := newApp()
	app.Commands = []*cli.Command{cmd}
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	if err := app.Run([]string{"proxyfleet", cmd.Name, "--config", config}); err != nil {
		t.Fatalf("a config file setting every flag is rejected: %v", err)
	}
	for _, n := range names {
		if !set[n] {
			t.Errorf("%s: in the --config file but not applied to --%s", n, n)
		}
	}
}
