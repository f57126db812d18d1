package testutil

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// StopChild signals a child server a launcher started itself (cmd, whose
// Wait closes done; a Squid, a redis-server) and waits for it to exit;
// after timeout it is killed. A child that had to be killed, or survives
// SIGKILL, is an error. A nil or already exited cmd is nothing to do.
func StopChild(cmd *exec.Cmd, done <-chan struct{}, sig syscall.Signal, timeout time.Duration) error {
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
	}
	_ = cmd.Process.Kill()
	select {
	case <-done:
		return fmt.Errorf("did not exit within %s of %v; killed", timeout, sig)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("pid %d did not exit even after SIGKILL", cmd.Process.Pid)
	}
}

// ReadFrom is up to 1 MiB of the file at path from offset on, "" when it
// cannot be read: what a child wrote to its log since a start began.
func ReadFrom(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	data, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return string(data)
}
