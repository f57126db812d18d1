package node

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// What the parent side of InNamespaces may do for a cluster that outlives
// a command (`make cluster`): find the process that runs it, and carry
// connections from the machine's network namespace into the cluster's.

// ChildPID is the machine's PID of the process InNamespaces started for the
// calling test (the parent side's one child, the cluster's PID namespace's
// init), or 0 while there is none.
func ChildPID() int {
	self := os.Getpid()
	for _, p := range processes() {
		if p.ppid == self {
			return p.pid
		}
	}
	return 0
}

// ForwardIntoCluster accepts connections on ln, a listener of the
// machine's network namespace, and carries each to addr (host:port) in the
// network namespace of the InNamespaces child: how kubectl on the machine
// reaches the API server at NodeIP, which only the cluster's namespace
// routes. It returns when ln is closed.
func ForwardIntoCluster(ln net.Listener, addr string) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			up, err := dialInChild(addr)
			if err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(up, conn); closeWrite(up); done <- struct{}{} }()
			go func() { _, _ = io.Copy(conn, up); closeWrite(conn); done <- struct{}{} }()
			<-done
			<-done
		}()
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// dialInChild dials addr from the child's network namespace: the socket is
// made on an OS thread moved into that namespace, then the thread moves
// back. A thread that cannot move back stays locked, so the runtime ends
// it with the goroutine rather than reuse it.
func dialInChild(addr string) (net.Conn, error) {
	pid := ChildPID()
	if pid == 0 {
		return nil, errors.New("node: the cluster's process is not running")
	}
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, err
	}
	defer target.Close()
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer self.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("node: entering the cluster's network namespace: %w", err)
	}
	conn, dialErr := net.DialTimeout("tcp", addr, 10*time.Second)
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("node: leaving the cluster's network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return conn, dialErr
}

// HostState is what a node must leave on the machine as it found it: the
// network interfaces, named network namespaces, mounts, iptables rules,
// kernel settings and the node's processes.
type HostState struct {
	Links, NetNS, Mounts, IPTables, Procs string
	Sysctls                               map[string]string
}

// ReadHostState reads the machine's state a node could change (the
// iptables rules without counters and comments, the processes of a node's
// components).
func ReadHostState() (HostState, error) {
	run := func(name string, args ...string) (string, error) {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out), nil
	}
	var s HostState
	var err error
	if s.Links, err = run("ip", "-o", "link", "show"); err != nil {
		return s, err
	}
	if s.NetNS, err = run("ip", "netns", "list"); err != nil {
		return s, err
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return s, err
	}
	s.Mounts = string(mounts)
	save, err := run("iptables-save")
	if err != nil {
		return s, err
	}
	var rules []string
	for _, l := range strings.Split(save, "\n") {
		if !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, ":") { // comments carry times, chain lines counters
			rules = append(rules, l)
		}
	}
	s.IPTables = strings.Join(rules, "\n")
	ps, err := run("ps", "-eo", "args")
	if err != nil {
		return s, err
	}
	var procs []string
	for _, l := range strings.Split(ps, "\n") {
		for _, c := range []string{"containerd", "kubelet", "kube-", "etcd", "runc", "/pause", "coredns"} {
			if strings.Contains(l, c) && strings.Contains(l, "proxyfleet-node") {
				procs = append(procs, l)
				break
			}
		}
	}
	s.Procs = strings.Join(procs, "\n")
	s.Sysctls = readSysctls()
	return s, nil
}

// Changes lists what differs in after, each with both states, and the
// cgroups of cgroupRoot still there ("" skips them).
func (s HostState) Changes(after HostState, cgroupRoot string) []string {
	var out []string
	for _, c := range []struct{ name, before, after string }{
		{"network interfaces", s.Links, after.Links},
		{"network namespaces", s.NetNS, after.NetNS},
		{"mounts", s.Mounts, after.Mounts},
		{"iptables rules", s.IPTables, after.IPTables},
		{"node processes", s.Procs, after.Procs},
	} {
		if c.before != c.after {
			out = append(out, fmt.Sprintf("%s changed:\nbefore:\n%s\nafter:\n%s", c.name, c.before, c.after))
		}
	}
	for k, v := range s.Sysctls {
		if after.Sysctls[k] != v {
			out = append(out, fmt.Sprintf("kernel setting %s is %s, was %s", k, after.Sysctls[k], v))
		}
	}
	if cgroupRoot != "" {
		for _, h := range cgroupHierarchies() {
			if _, err := os.Stat(h + "/" + cgroupRoot); err == nil {
				out = append(out, fmt.Sprintf("the node's cgroup %s/%s is left", h, cgroupRoot))
			}
		}
	}
	return out
}
