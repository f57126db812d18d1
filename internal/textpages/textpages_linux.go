package textpages

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
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
		major, minor, ok := hexPair(f[3], ":", 32)
		if !ok {
			return nil, fmt.Errorf("/proc/self/maps: unexpected device %q", f[3])
		}
		if unix.Mkdev(uint32(major), uint32(minor)) != dev {
			continue
		}
		start, end, ok := hexPair(f[0], "-", 64)
		if !ok || end <= start {
			return nil, fmt.Errorf("/proc/self/maps: unexpected range %q", f[0])
		}
		out = append(out, region{start: uintptr(start), end: uintptr(end)})
	}
	return out, sc.Err()
}

// region is one mapping of the executable's read-only segments.
type region struct{ start, end uintptr }

func (r region) len() uintptr { return r.end - r.start }

// hexPair reads "a<sep>b", two hexadecimal numbers of at most bits bits,
// as /proc/self/maps writes an address range and a device.
func hexPair(s, sep string, bits int) (a, b uint64, ok bool) {
	x, y, ok := strings.Cut(s, sep)
	if !ok {
		return 0, 0, false
	}
	a, errA := strconv.ParseUint(x, 16, bits)
	b, errB := strconv.ParseUint(y, 16, bits)
	return a, b, errA == nil && errB == nil
}
