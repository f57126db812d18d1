package sites

import (
	"slices"
	"strings"
	"testing"
)

func TestParsePortsReadsACommaSeparatedList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []uint16
		err  string
	}{
		{in: "80", want: []uint16{80}},
		{in: " 80, 8080 ,80", want: []uint16{80, 8080}},
		{in: "", want: []uint16{}},
		{in: ",", want: []uint16{}},
		{in: "0", err: `"0" is not a port`},
		{in: "65536", err: `"65536" is not a port`},
		{in: "80;81", err: `"80;81" is not a port`},
		{in: "-1", err: `"-1" is not a port`},
	} {
		got, err := ParsePorts(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParsePorts(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) || got == nil {
			t.Errorf("ParsePorts(%q) = %v, %v; want %v (never nil: nil is the default)", tc.in, got, err, tc.want)
		}
	}
}
