// Command proxyfleet is the one binary: the rotating egress gateway, the
// controller that keeps the upstream fleet alive, and a lease API client.
//
// It is flags and wiring: it turns flags into gateway/daemon.Config and
// controller/manager.Config and wires the provider types; the runs themselves
// are not here, and no package imports it.
package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := newApp().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "proxyfleet:", err)
		os.Exit(1)
	}
}

func newApp() *cli.App {
	return &cli.App{
		Name:                 "proxyfleet",
		Usage:                "rotating egress gateway for crawlers, and the controller that keeps its upstreams alive",
		Version:              version,
		EnableBashCompletion: true,
		Commands: append(controllerCommands(),
			leaseCommand(),
			gatewayCommand(),
			mitmCACommand(),
			versionCommand(),
		),
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: func(c *cli.Context) error {
			fmt.Fprintln(c.App.Writer, "proxyfleet", version)
			return nil
		},
	}
}
