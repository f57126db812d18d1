// Package echo makes strings that came from outside (a client's target, a
// member's answer line, a certificate's name) safe to write back in a text
// answer or a log line: quoted, printable ASCII only, bounded. It imports
// nothing of proxyfleet's.
package echo

import "strings"

// Quote makes a client-supplied string safe to echo in a text body: printable
// ASCII is kept, anything else becomes '?', long strings are cut.
func Quote(s string) string {
	const max = 64
	var b strings.Builder
	b.Grow(min(len(s), max) + 5)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if i == max {
			b.WriteString("...")
			break
		}
		c := s[i]
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String()
}
