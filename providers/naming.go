package providers

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// NamePrefix starts every instance name NameFromUID returns.
const NamePrefix = "proxy-"

// NameFromUID returns the deterministic instance name for the Proxy with the
// given UID: "proxy-" plus the first 16 characters of the lower-case, unpadded
// base32 encoding of SHA-256(uid). The alphabet [a-z2-7] and the length (22)
// make it a legal GCP instance name, Pod name, DNS-1123 label and libvirt
// domain name; 16 characters keep 80 bits against collisions. Because the name
// depends only on the UID, a retried Create finds what an earlier attempt
// started, and a replacement instance gets the same name as the one it replaces.
func NameFromUID(uid string) string {
	sum := sha256.Sum256([]byte(uid))
	enc := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:])
	return NamePrefix + strings.ToLower(enc[:16])
}
