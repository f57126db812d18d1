package testutil

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// listensOn reports whether process pid holds a listening TCP socket that
// accepts on addr (its exact address or a wildcard on the same port). It reads
// /proc: Linux only, which is where the suites run.
func listensOn(pid int, addr string) (bool, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return false, err
	}
	want := net.ParseIP(host)
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		if err := listeningInodes(f, want, port, inodes); err != nil {
			return false, err
		}
	}
	if len(inodes) == 0 {
		return false, nil
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok && inodes[strings.TrimSuffix(ino, "]")] {
			return true, nil
		}
	}
	return false, nil
}

// listeningInodes adds the inodes of LISTEN sockets in a /proc/net/tcp{,6}
// table that accept connections for ip:port.
func listeningInodes(path string, ip net.IP, port int, into map[string]bool) error {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" { // 0A = TCP_LISTEN
			continue
		}
		hexIP, hexPort, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil || int(p) != port {
			continue
		}
		local, err := procIP(hexIP)
		if err != nil {
			continue
		}
		if local.IsUnspecified() || local.Equal(ip) {
			into[fields[9]] = true
		}
	}
	return sc.Err()
}

// procIP decodes /proc/net's address encoding: 32-bit words in host (little-endian) order.
func procIP(s string) (net.IP, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b)%4 != 0 {
		return nil, fmt.Errorf("bad /proc/net address %q", s)
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	return net.IP(b), nil
}
