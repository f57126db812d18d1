package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
)

// tokenSet checks client tokens in constant time: every configured token is
// compared (as a SHA-256 digest, so lengths leak nothing) whatever matches.
type tokenSet [][sha256.Size]byte

func newTokenSet(tokens []string) tokenSet {
	s := make(tokenSet, 0, len(tokens))
	for _, t := range tokens {
		s = append(s, sha256.Sum256([]byte(t)))
	}
	return s
}

func (s tokenSet) match(token string) bool {
	got := sha256.Sum256([]byte(token))
	found := 0
	for i := range s {
		found |= subtle.ConstantTimeCompare(got[:], s[i][:])
	}
	return found == 1
}
