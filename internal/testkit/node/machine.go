package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// kernelSettings are the machine-wide settings the kubelet writes when it
// starts (its kernel tunables; protectKernelDefaults would make it refuse
// to start instead) and kube-proxy could: InNamespaces puts back whatever
// they were.
var kernelSettings = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
	"net/netfilter/nf_conntrack_max",
}

func readSysctls() map[string]string {
	saved := map[string]string{}
	for _, k := range kernelSettings {
		if v, err := os.ReadFile("/proc/sys/" + k); err == nil {
			saved[k] = strings.TrimSpace(string(v))
		}
	}
	return saved
}

func restoreSysctls(saved map[string]string) error {
	var errs []error
	for k, want := range saved {
		v, err := os.ReadFile("/proc/sys/" + k)
		if err == nil && strings.TrimSpace(string(v)) == want {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(want), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("%s=%s: %w", k, want, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupHierarchies are the cgroup v1 hierarchies mounted under
// /sys/fs/cgroup (cpu, memory, ..., name=systemd's "systemd").
func cgroupHierarchies() []string {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil
	}
	var dirs []string
	for _, e := range entries {
		d := filepath.Join("/sys/fs/cgroup", e.Name())
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			continue // cpu,cpuacct style links point at a real one
		}
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// makeCgroupRoot creates the kubelet's cgroupRoot in every hierarchy (the
// kubelet refuses a root that is missing from one); a cpuset cgroup needs
// its CPUs and memory nodes before a task or a child can join it.
func makeCgroupRoot(root string) error {
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, root)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				continue
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("%s: %w", filepath.Join(d, f), err)
			}
		}
	}
	return nil
}

// removeCgroups removes the cgroup root and everything the kubelet made
// under it, deepest first; it retries while the killed processes leave.
func removeCgroups(root string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []string
		for _, h := range cgroupHierarchies() {
			top := filepath.Join(h, root)
			var dirs []string
			_ = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			slices.Reverse(dirs)
			for _, d := range dirs {
				if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
					left = append(left, d)
				}
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroups still busy: %s", strings.Join(left, ", "))
		}
		time.Sleep(500 * time.Millisecond)
	}
}
