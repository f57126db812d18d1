//go:build race

package gateway

// raceBuild: the test binary runs under the race detector.
const raceBuild = true
