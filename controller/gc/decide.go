package gc

import (
	"time"

	"github.com/proxyfleet/proxyfleet/providers"
)

// decision is the GC's verdict on one instance: delete it, or why it stays.
type decision string

const (
	// deleteOrphan: the instance is a provable orphan — it carries an owner UID, is
	// older than the minimum age, and no Proxy has that UID.
	deleteOrphan decision = "orphan"
	// keepUntagged: the instance carries no owner UID, so nothing proves that
	// proxyfleet made it for a Proxy; the GC never touches it.
	keepUntagged decision = "untagged"
	// keepForeign: the instance carries another installation's ID, or none
	// (made before instances were tagged with one): it may be the live
	// instance of a Proxy in another cluster sharing the backend.
	keepForeign decision = "foreign"
	// keepUnknownAge: the provider reported no creation time, so the
	// instance may be mid-create; age cannot be proven.
	keepUnknownAge decision = "unknown-age"
	// keepYoung: the instance is younger than the minimum age; its Proxy may
	// have created it and crashed before recording it, and the next reconcile
	// adopts it.
	keepYoung decision = "young"
	// keepLive: a Proxy with the instance's owner UID exists (deleting ones
	// included: their finalizer owns that deletion).
	keepLive decision = "live"
)

// decide is the GC's whole decision rule, free of I/O so it can be tested as
// a table: an instance is deleted only when every proof of orphanhood holds.
// live holds the UIDs of every Proxy the controller can see; installation
// is this controller's installation ID; now and minAge decide whether the
// instance is old enough to be past its Create.
func decide(inst providers.Instance, live map[string]struct{}, installation string, now time.Time, minAge time.Duration) decision {
	if inst.OwnerUID == "" {
		return keepUntagged
	}
	if inst.Installation != installation {
		return keepForeign
	}
	if _, ok := live[inst.OwnerUID]; ok {
		return keepLive
	}
	if inst.CreatedAt.IsZero() {
		return keepUnknownAge
	}
	// A creation time in the future (clock skew between the backend and the
	// controller) gives a negative age, which is young: keep.
	if now.Sub(inst.CreatedAt) < minAge {
		return keepYoung
	}
	return deleteOrphan
}
