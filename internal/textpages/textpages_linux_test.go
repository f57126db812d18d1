package textpages

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestReadOnlyRegions(t *testing.T) {
	const dev = 0xfd<<8 | 1 // 00fd:01 as stat reports it
	for _, tc := range []struct {
		name string
		maps string
		want []region
	}{
		{"code and read-only data of the executable are taken", "" +
			"00400000-00ba7000 r-xp 00000000 fd:01 4242 /bin/proxyfleet\n" +
			"00ba7000-0138a000 r--p 007a6000 fd:01 4242 /bin/proxyfleet\n",
			[]region{{0x400000, 0xba7000}, {0xba7000, 0x138a000}}},
		{"a writable mapping of it is left alone: its pages hold data the file does not", "" +
			"0138a000-01437000 rw-p 00f89000 fd:01 4242 /bin/proxyfleet\n", nil},
		{"a shared mapping is left alone", "" +
			"00400000-00ba7000 r--s 00000000 fd:01 4242 /bin/proxyfleet\n", nil},
		{"another file is left alone, even with the same inode on another device", "" +
			"7f0000000000-7f0000001000 r--p 00000000 fd:01 99 /usr/lib/locale/C.utf8\n" +
			"7f0000001000-7f0000002000 r--p 00000000 fd:02 4242 /mnt/other\n", nil},
		{"anonymous memory (inode 0) is left alone", "" +
			"c000000000-c000400000 rw-p 00000000 00:00 0 \n" +
			"7ffd00000000-7ffd00021000 r--p 00000000 00:00 0 [vvar]\n", nil},
		{"a binary replaced on disk since the start is still found by inode", "" +
			"00400000-00ba7000 r-xp 00000000 fd:01 4242 /bin/proxyfleet (deleted)\n",
			[]region{{0x400000, 0xba7000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readOnlyRegions([]byte(tc.maps), dev, 4242)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
	for _, bad := range []string{"00400000-00ba7000 r-xp 00000000\n", "00400000 r-xp 00000000 fd:01 4242 /x\n", "00400000-00ba7000 r-xp 00000000 fd01 4242 /x\n", "00ba7000-00400000 r-xp 00000000 fd:01 4242 /x\n"} {
		if _, err := readOnlyRegions([]byte(bad), dev, 4242); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestReleaseUnmapsTheExecutablesStartPages runs this test binary again as
// a child that has started (and so has much of its code mapped), releases
// when told, then blocks: its executable's resident pages fall to the few
// that telling it used, and code that ran before and after runs as it did.
func TestReleaseUnmapsTheExecutablesStartPages(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewReader(stdout)
	line := func() string {
		t.Helper()
		s, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("the child: %v", err)
		}
		return strings.TrimSpace(s)
	}
	first := line()
	before := exeRSS(t, cmd.Process.Pid)
	io.WriteString(stdin, "release\n")
	released := line()
	after := exeRSS(t, cmd.Process.Pid)
	io.WriteString(stdin, "again\n")
	second := line()
	t.Logf("the child's executable: %d KiB mapped after its start, %d KiB after Release (%s)", before>>10, after>>10, released)
	if !strings.HasPrefix(released, "released ") {
		t.Fatalf("the child: %s", released)
	}
	if before < 1<<20 {
		t.Fatalf("the child has only %d KiB of its executable mapped after its start: nothing to measure", before>>10)
	}
	// Not "half": the child runs between Release and the reading (it
	// answers, its runtime's goroutines wake), and every page it touches
	// faults 64 KiB back in. With the race detector's runtime that was 40-44 %
	// of the start's pages on a quiet machine and 52 % on a busy one (CI
	// failed on it); a Release that gave nothing back leaves them all.
	if after > before*2/3 {
		t.Errorf("after Release %d KiB of the executable are still mapped (before %d KiB): the start's pages were not given back", after>>10, before>>10)
	}
	if first != second || first == "" {
		t.Errorf("the same code gave %q before Release and %q after", first, second)
	}
}

// childEnv makes the test binary the child of
// TestReleaseUnmapsTheExecutablesStartPages.
const childEnv = "TEXTPAGES_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "" {
		os.Exit(m.Run())
	}
	in := bufio.NewReader(os.Stdin)
	work := func() string { return fmt.Sprintf("%x", sha256.Sum256([]byte(strings.Repeat("proxyfleet", 1000)))) }
	fmt.Println(work())
	in.ReadString('\n')
	n, err := Release()
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Printf("released %d KiB of mappings\n", n>>10)
	in.ReadString('\n')
	fmt.Println(work())
	in.ReadString('\n')
	os.Exit(0)
}

// exeRSS is the resident size of process pid's read-only mappings of its
// executable, from its smaps.
func exeRSS(t *testing.T, pid int) int64 {
	t.Helper()
	var st syscall.Stat_t
	proc := "/proc/" + strconv.Itoa(pid)
	if err := syscall.Stat(proc+"/exe", &st); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(proc + "/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	in := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && len(f[1]) == 4:
			in = f[4] == strconv.FormatUint(st.Ino, 10) && f[1][1] != 'w'
		case in && len(f) == 3 && f[0] == "Rss:":
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			total += kb << 10
		}
	}
	return total
}
