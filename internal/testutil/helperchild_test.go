package testutil

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// helperChild runs in a re-executed test binary: listen, report, exit 0 on SIGTERM.
func helperChild(addr string) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child listen:", err)
		os.Exit(3)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, kv := range os.Environ() {
		if strings.Contains(strings.ToUpper(kv), "_PROXY=") {
			fmt.Println("env", kv)
		}
	}
	fmt.Println("child ready")
	<-sigs
	fmt.Println("child got terminated")
	ln.Close()
	os.Exit(0)
}
