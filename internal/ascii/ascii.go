// Package ascii compares HTTP field names and tokens without allocating:
// names on the wire are ASCII, and strings.EqualFold's Unicode folding
// would call "K" (the Kelvin sign) equal to "k", which no HTTP peer does.
// It imports nothing, so the head parsers and writers below it can share it.
package ascii

// EqualFold reports whether a and b are equal under ASCII case folding,
// with a in bytes or a string (a field name sliced from a read buffer
// needs no conversion).
func EqualFold[T string | []byte](a T, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(b) {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
