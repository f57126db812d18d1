package textpages

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Release unmaps the executable's read-only, private file mappings (its
// code and read-only data; never a writable one, whose pages may hold
// data the file does not) and returns how many bytes they span. Call it
// once, when the start is over: pages used afterwards are mapped again on
// their first use and stay.
func Release() (uintptr, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &st); err != nil {
		return 0, fmt.Errorf("the executable: %w", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	regions, err := readOnlyRegions(maps, uint64(st.Dev), st.Ino)
	if err != nil {
		return 0, err
	}
	var n uintptr
	for _, r := range regions {
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, r.start, r.len(), syscall.MADV_DONTNEED); errno != 0 {
			return n, fmt.Errorf("madvise %#x-%#x: %w", r.start, r.end, errno)
		}
		n += r.len()
	}
	return n, nil
}

// readOnlyRegions reads /proc/self/maps (as maps) and returns the private
// mappings without write permission of the file on device dev with inode
// ino: the executable's, found by inode so that a binary replaced on disk
// since the start (shown "(deleted)") is still found. dev is the device
// number as stat gives it.
func readOnlyRegions(maps []byte, dev, ino uint64) ([]region, error) {
	var out []region
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		// start-end perms offset major:minor inode [path]
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			return nil, fmt.Errorf("/proc/self/maps: unexpected line %q", sc.Text())
		}
		perms := f[1]
		if len(perms) != 4 || perms[1] == 'w' || perms[3] != 'p' {
			continue
		}
		if i, err := strconv.ParseUint(f[4], 10, 64); err != nil || i != ino || i == 0 {
			continue
		}
		major, minor, ok := strings.Cut(f[3], ":")
		if !ok {
			return nil, fmt.Errorf("/proc/self/maps: unexpected device %q", f[3])
		}
		ma, err1 := strconv.ParseUint(major, 16, 32)
		mi, err2 := strconv.ParseUint(minor, 16, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("/proc/self/maps: unexpected device %q", f[3])
		}
		if mkdev(ma, mi) != dev {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			return nil, fmt.Errorf("/proc/self/maps: unexpected range %q", f[0])
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			return nil, fmt.Errorf("/proc/self/maps: unexpected range %q", f[0])
		}
		out = append(out, region{start: uintptr(start), end: uintptr(end)})
	}
	return out, sc.Err()
}

// region is one mapping of the executable's read-only segments.
type region struct{ start, end uintptr }

func (r region) len() uintptr { return r.end - r.start }

// mkdev is glibc's makedev: the device number stat reports for a major
// and minor number.
func mkdev(major, minor uint64) uint64 {
	return (major&0xfff)<<8 | (major&^0xfff)<<32 | minor&0xff | (minor&^0xff)<<12
}
