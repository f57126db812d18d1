package gc

import (
	"time"

	"github.com/proxyfleet/proxyfleet/providers"
)

// Decision is the GC's verdict on one instance: delete it, or why it stays.
type Decision string

const (
	// Delete: the instance is a provable orphan — it carries an owner UID, is
	// older than the minimum age, and no Proxy has that UID.
	Delete Decision = "orphan"
	// KeepUntagged: the instance carries no owner UID, so nothing proves that
	// proxyfleet made it for a Proxy; the GC never touches it.
	KeepUntagged Decision = "untagged"
	// KeepUnknownAge: the provider reported no creation time, so the
	// instance may be mid-create; age cannot be proven.
	KeepUnknownAge Decision = "unknown-age"
	// KeepYoung: the instance is younger than the minimum age; its Proxy may
	// have created it and crashed before recording it, and the next reconcile
	// adopts it.
	KeepYoung Decision = "young"
	// KeepLive: a Proxy with the instance's owner UID exists (deleting ones
	// included: their finalizer owns that deletion).
	KeepLive Decision = "live"
)

// Decide is the GC's whole decision rule, free of I/O so it can be tested as
// a table: an instance is deleted only when every proof of orphanhood holds.
// live holds the UIDs of every Proxy the controller can see; now and minAge
// decide whether the instance is old enough to be past its Create.
func Decide(inst providers.Instance, live map[string]struct{}, now time.Time, minAge time.Duration) Decision {
	if inst.OwnerUID == "" {
		return KeepUntagged
	}
	if _, ok := live[inst.OwnerUID]; ok {
		return KeepLive
	}
	if inst.CreatedAt.IsZero() {
		return KeepUnknownAge
	}
	// A creation time in the future (clock skew between the backend and the
	// controller) gives a negative age, which is young: keep.
	if now.Sub(inst.CreatedAt) < minAge {
		return KeepYoung
	}
	return Delete
}
