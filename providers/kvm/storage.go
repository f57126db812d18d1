package kvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/proxyfleet/proxyfleet/internal/redact"
	"github.com/proxyfleet/proxyfleet/providers"
)

func statFile(path string) (os.FileInfo, error) { return os.Stat(path) }

// lookupPool finds the host's pool; a missing pool needs an admin.
func (p *Provider) lookupPool(ctx context.Context, host, name string) (libvirt.StoragePool, error) {
	pool, err := rpcV(ctx, p, host, "StoragePoolLookupByName", func(a api) (libvirt.StoragePool, error) { return a.StoragePoolLookupByName(name) })
	if err != nil {
		return pool, classify(fmt.Sprintf("looking up storage pool %s on host %s", name, host), err)
	}
	return pool, nil
}

// lookupVolume returns the volume and whether it exists.
func (p *Provider) lookupVolume(ctx context.Context, host string, pool libvirt.StoragePool, name string) (libvirt.StorageVol, bool, error) {
	vol, err := rpcV(ctx, p, host, "StorageVolLookupByName", func(a api) (libvirt.StorageVol, error) { return a.StorageVolLookupByName(pool, name) })
	if isCode(err, libvirt.ErrNoStorageVol) {
		return vol, false, nil
	}
	if err != nil {
		return vol, false, classify("looking up volume "+name, err)
	}
	return vol, true, nil
}

func (p *Provider) volumePath(ctx context.Context, host string, vol libvirt.StorageVol) (string, error) {
	path, err := rpcV(ctx, p, host, "StorageVolGetPath", func(a api) (string, error) { return a.StorageVolGetPath(vol) })
	if err != nil {
		return "", classify("resolving the path of volume "+vol.Name, err)
	}
	return path, nil
}

func (p *Provider) deleteVolume(ctx context.Context, host string, vol libvirt.StorageVol) error {
	err := p.rpc(ctx, host, "StorageVolDelete", func(a api) error { return a.StorageVolDelete(vol, 0) })
	if err != nil && !isCode(err, libvirt.ErrNoStorageVol) {
		return classify("deleting volume "+vol.Name, err)
	}
	return nil
}

// removeVolumes deletes volumes by name; a missing pool or volume is success.
func (p *Provider) removeVolumes(ctx context.Context, host, poolName string, names ...string) error {
	pool, err := p.lookupPool(ctx, host, poolName)
	if isCode(err, libvirt.ErrNoStoragePool) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, n := range names {
		vol, ok, err := p.lookupVolume(ctx, host, pool, n)
		if err != nil {
			return err
		}
		if ok {
			if err := p.deleteVolume(ctx, host, vol); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkSpace refreshes the pool and returns QuotaExceeded when fewer than
// need bytes are free. libvirt reports a full pool as an ordinary error,
// which would retry on the fast backoff; the reconciler waits out
// QuotaExceeded on a long, quiet interval instead.
func (p *Provider) checkSpace(ctx context.Context, host string, pool libvirt.StoragePool, need uint64) error {
	err := p.rpc(ctx, host, "StoragePoolRefresh", func(a api) error { return a.StoragePoolRefresh(pool, 0) })
	if err != nil {
		return classify("refreshing pool "+pool.Name, err)
	}
	avail, err := rpcV(ctx, p, host, "StoragePoolGetInfo", func(a api) (uint64, error) {
		_, _, _, avail, err := a.StoragePoolGetInfo(pool)
		return avail, err
	})
	if err != nil {
		return classify("reading pool "+pool.Name, err)
	}
	if avail < need {
		return fmt.Errorf("%w: pool %s on host %s has %d MiB free, this guest needs %d MiB", providers.ErrQuotaExceeded, pool.Name, host, avail>>20, need>>20)
	}
	return nil
}

// cachedBase is a base image present and complete in a pool.
type cachedBase struct {
	path, format string
}

// ensureImage makes sure the base image is in the pool and verified, and
// checks that the pool has room for it (when it must be fetched) plus
// extra. The base is complete only when its marker volume exists: an
// empty volume whose name carries the sha256 of what was uploaded
// ("<base>.sha256-<digest>"), made last. A base without a marker is debris
// of a cut-off upload and is replaced. A marker whose digest differs from
// the configured one is Permanent and nothing is deleted: guests may run
// on that base, and the rule is a new images key for a new image.
//
// The digest is in the name, not the content, so one pool listing reads
// it: a download stream per Create would be the one call here that can
// hang on a busy libvirtd, and it would hang every Create behind it.
func (p *Provider) ensureImage(ctx context.Context, pl placement, pool libvirt.StoragePool, extra uint64) (cachedBase, error) {
	host := pl.host.Name
	name := baseVolumeName(p.cfg.Entry, pl.imageKey, pl.image.Format)
	// Another Create holds the image: most likely downloading it, which may
	// take up to the ImageTransfer budget. Waiting for it would hold this
	// reconcile worker too, and with a few Proxies on a new image every
	// worker, freezing the whole fleet's reconciles (deletes, health) for
	// the download; a transient error retries with backoff instead.
	unlock, ok := p.images.TryLock(host + "/" + name)
	if !ok {
		return cachedBase{}, fmt.Errorf("%w: base image %s on host %s is being prepared (downloaded) by another Create; retrying", providers.ErrTransient, name, host)
	}
	defer unlock()

	vols, err := p.poolVolumes(ctx, host, pool)
	if err != nil {
		return cachedBase{}, err
	}
	base, hasBase := vols[name]
	var markers []libvirt.StorageVol
	digest := ""
	for vname, vol := range vols {
		if d, ok := parseMarkerVolume(name, vname); ok {
			markers = append(markers, vol)
			digest = d
		}
	}
	if hasBase && len(markers) == 1 && hex64(digest) {
		if want := pl.image.SHA256; want != "" && want != digest {
			return cachedBase{}, fmt.Errorf("%w: base image %s on host %s has sha256 %s, the config now says %s; guests may be running on it, so it is not replaced: add a new images key for the new image (and delete the old base and its marker by hand once unused)",
				providers.ErrPermanent, name, host, digest, want)
		}
		if err := p.checkSpace(ctx, host, pool, extra); err != nil {
			return cachedBase{}, err
		}
		path, err := p.volumePath(ctx, host, base)
		return cachedBase{path: path, format: pl.image.Format}, err
	}
	// Debris: a marker without a base, a base without a marker, markers
	// that are not one digest. The markers go first, so nothing ever looks
	// complete while it is half gone.
	for _, m := range markers {
		if err := p.deleteVolume(ctx, host, m); err != nil {
			return cachedBase{}, err
		}
	}
	if hasBase {
		if err := p.deleteVolume(ctx, host, base); err != nil {
			return cachedBase{}, err
		}
	}
	digest, err = p.fetchImage(ctx, pl, pool, name, extra)
	if err != nil {
		return cachedBase{}, err
	}
	mname := markerVolumeName(name, digest)
	_, err = rpcV(ctx, p, host, "StorageVolCreateXML", func(a api) (libvirt.StorageVol, error) {
		return a.StorageVolCreateXML(pool, rawVolumeXML(mname, 0), 0)
	})
	if err != nil && !isCode(err, libvirt.ErrStorageVolExist) {
		return cachedBase{}, classify("creating marker volume "+mname, err)
	}
	base, _, err = p.lookupVolume(ctx, host, pool, name)
	if err != nil {
		return cachedBase{}, err
	}
	path, err := p.volumePath(ctx, host, base)
	return cachedBase{path: path, format: pl.image.Format}, err
}

func hex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// httpStatusError is a non-2xx answer from the image server.
func httpStatusVerdict(code int) error {
	switch {
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
		return providers.ErrTransient
	default:
		return providers.ErrPermanent
	}
}

// fetchImage downloads the image and streams it into a new base volume on
// a dedicated connection, so a long transfer cannot be killed by another
// call's timeout on the pooled one (and cannot kill it). The body's own
// deadline ends a minute inside the transfer budget, so a stalled mirror
// ends through its reader, not by a socket kill. It returns the digest of
// what was uploaded; on any failure the half-written base is deleted once
// the dedicated connection is closed.
func (p *Provider) fetchImage(ctx context.Context, pl placement, pool libvirt.StoragePool, name string, extra uint64) (string, error) {
	host := pl.host.Name
	budget := p.cfg.Budgets.ImageTransfer
	bodyBudget := budget - time.Minute
	if bodyBudget < budget/2 {
		bodyBudget = budget / 2
	}
	dctx, cancel := context.WithTimeout(ctx, bodyBudget)
	defer cancel()
	req, err := http.NewRequestWithContext(dctx, http.MethodGet, pl.image.URL, nil)
	if err != nil {
		return "", fmt.Errorf("%w: image %s: %s", providers.ErrPermanent, pl.imageKey, redact.Reason(pl.image.URL, err))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// The client's error quotes the URL: a presigned one carries its
		// signature in the query (net/http masks only a password).
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = redact.URL(ue.URL)
		}
		return "", fmt.Errorf("%w: downloading image %s: %v", providers.ErrTransient, pl.imageKey, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("%w: downloading image %s: the server answered %s", httpStatusVerdict(resp.StatusCode), pl.imageKey, resp.Status)
	}
	if resp.ContentLength <= 0 {
		return "", fmt.Errorf("%w: downloading image %s: the server sends no Content-Length, and a libvirt upload needs the size up front", providers.ErrPermanent, pl.imageKey)
	}
	size := uint64(resp.ContentLength)
	if err := p.checkSpace(ctx, host, pool, size+extra); err != nil {
		return "", err
	}

	l, err := dial(ctx, p.login, host, pl.host.Address, p.cfg.Budgets.Dial)
	if err != nil {
		return "", err
	}
	vol, err := runV(ctx, l, "StorageVolCreateXML", p.cfg.Budgets.RPC, func(a api) (libvirt.StorageVol, error) {
		return a.StorageVolCreateXML(pool, rawVolumeXML(name, size), 0)
	})
	if err != nil {
		l.kill("done")
		return "", classify("creating base volume "+name, err)
	}
	// The reader state is read only inside the call and handed back, never
	// from here: after a budget overrun the upload may still be reading.
	type upload struct {
		srcErr error
		n      int64
		digest string
	}
	body := resp.Body
	up, upErr := runV(ctx, l, "StorageVolUpload", budget, func(a api) (upload, error) {
		sum := sha256.New()
		counted := &countingReader{r: io.TeeReader(body, sum)}
		src := &eofReader{r: counted}
		err := a.StorageVolUpload(vol, src, 0, size, 0)
		return upload{srcErr: src.err, n: counted.n, digest: hex.EncodeToString(sum.Sum(nil))}, err
	})
	l.kill("done")
	digest := up.digest
	var verdict error
	switch {
	case up.srcErr != nil:
		verdict = fmt.Errorf("%w: downloading image %s broke off after %d of %d bytes: %v", providers.ErrTransient, pl.imageKey, up.n, size, up.srcErr)
	case upErr != nil:
		verdict = classify("uploading image "+pl.imageKey, upErr)
	case uint64(up.n) != size:
		verdict = fmt.Errorf("%w: image %s: got %d of %d bytes", providers.ErrTransient, pl.imageKey, up.n, size)
	case pl.image.SHA256 != "" && digest != pl.image.SHA256:
		verdict = fmt.Errorf("%w: image %s has sha256 %s, the config expects %s (wrong digest in the config, or the URL serves a different file)", providers.ErrPermanent, pl.imageKey, digest, pl.image.SHA256)
	}
	if verdict != nil {
		if vol, ok, err := p.lookupVolume(ctx, host, pool, name); err == nil && ok {
			_ = p.deleteVolume(ctx, host, vol)
		}
		return "", verdict
	}
	return digest, nil
}

// writeRaw creates volume name holding exactly data, replacing any volume
// of that name.
func (p *Provider) writeRaw(ctx context.Context, host string, pool libvirt.StoragePool, name string, data []byte, budget time.Duration) error {
	if old, ok, err := p.lookupVolume(ctx, host, pool, name); err != nil {
		return err
	} else if ok {
		if err := p.deleteVolume(ctx, host, old); err != nil {
			return err
		}
	}
	vol, err := rpcV(ctx, p, host, "StorageVolCreateXML", func(a api) (libvirt.StorageVol, error) {
		return a.StorageVolCreateXML(pool, rawVolumeXML(name, uint64(len(data))), 0)
	})
	if err != nil {
		return classify("creating volume "+name, err)
	}
	err = p.call(ctx, host, "StorageVolUpload", budget, func(a api) error {
		return a.StorageVolUpload(vol, &eofReader{r: bytes.NewReader(data)}, 0, uint64(len(data)), 0)
	})
	if err != nil {
		return classify("uploading volume "+name, err)
	}
	return nil
}

// ensureOverlay reuses the guest's overlay or creates it over the base,
// and returns its path.
func (p *Provider) ensureOverlay(ctx context.Context, host string, pool libvirt.StoragePool, name string, diskBytes uint64, base cachedBase) (string, error) {
	vname := overlayVolumeName(name)
	vol, ok, err := p.lookupVolume(ctx, host, pool, vname)
	if err != nil {
		return "", err
	}
	if !ok {
		vol, err = rpcV(ctx, p, host, "StorageVolCreateXML", func(a api) (libvirt.StorageVol, error) {
			return a.StorageVolCreateXML(pool, overlayXML(vname, diskBytes, base.path, base.format), 0)
		})
		if isCode(err, libvirt.ErrStorageVolExist) {
			return p.ensureOverlay(ctx, host, pool, name, diskBytes, base)
		}
		if err != nil {
			return "", classify("creating overlay "+vname, err)
		}
	}
	return p.volumePath(ctx, host, vol)
}

// writeSeed rebuilds the guest's seed volume and returns its path.
func (p *Provider) writeSeed(ctx context.Context, host string, pool libvirt.StoragePool, name string, iso []byte) (string, error) {
	vname := seedVolumeName(name)
	if err := p.writeRaw(ctx, host, pool, vname, iso, p.cfg.Budgets.SeedUpload); err != nil {
		return "", err
	}
	vol, _, err := p.lookupVolume(ctx, host, pool, vname)
	if err != nil {
		return "", err
	}
	return p.volumePath(ctx, host, vol)
}

// markGuest makes the guest's mark volume before anything else of the
// guest exists, and returns the mark in force: an earlier attempt's, when
// one with mark's UID is there (its time is when the guest was first
// begun). A mark with another UID is Permanent and nothing is touched.
func (p *Provider) markGuest(ctx context.Context, host string, pool libvirt.StoragePool, name string, mark Mark) (Mark, error) {
	if !markUID.MatchString(mark.UID) {
		return Mark{}, fmt.Errorf("%w: owner UID %q cannot be written into a volume name", providers.ErrPermanent, mark.UID)
	}
	if mark.Installation != "" && !markUID.MatchString(mark.Installation) {
		return Mark{}, fmt.Errorf("%w: installation %q cannot be written into a volume name", providers.ErrPermanent, mark.Installation)
	}
	vols, err := p.poolVolumes(ctx, host, pool)
	if err != nil {
		return Mark{}, err
	}
	for vname := range vols {
		guest, old, ok := parseMarkVolume(vname)
		switch {
		case !ok || guest != name:
		case old.UID == mark.UID:
			old.Proxy = mark.Proxy
			return old, nil
		default:
			return Mark{}, fmt.Errorf("%w: mark volume %s on host %s belongs to proxy UID %q, not %q", providers.ErrPermanent, vname, host, old.UID, mark.UID)
		}
	}
	vname := markVolumeName(name, mark)
	_, err = rpcV(ctx, p, host, "StorageVolCreateXML", func(a api) (libvirt.StorageVol, error) {
		return a.StorageVolCreateXML(pool, rawVolumeXML(vname, 0), 0)
	})
	if err != nil && !isCode(err, libvirt.ErrStorageVolExist) {
		return Mark{}, classify("creating mark volume "+vname, err)
	}
	return mark, nil
}

// removeMarks deletes the guest's mark volumes, whoever's UID they carry
// (Delete is by name); a missing pool is success.
func (p *Provider) removeMarks(ctx context.Context, host, poolName, name string) error {
	pool, err := p.lookupPool(ctx, host, poolName)
	if isCode(err, libvirt.ErrNoStoragePool) {
		return nil
	}
	if err != nil {
		return err
	}
	vols, err := p.poolVolumes(ctx, host, pool)
	if err != nil {
		return err
	}
	for vname, vol := range vols {
		if guest, _, ok := parseMarkVolume(vname); ok && guest == name {
			if err := p.deleteVolume(ctx, host, vol); err != nil {
				return err
			}
		}
	}
	return nil
}

// poolVolumes returns the pool's volumes by name, as libvirt knows them.
func (p *Provider) poolVolumes(ctx context.Context, host string, pool libvirt.StoragePool) (map[string]libvirt.StorageVol, error) {
	vols, err := rpcV(ctx, p, host, "StoragePoolListAllVolumes", func(a api) ([]libvirt.StorageVol, error) {
		vols, _, err := a.StoragePoolListAllVolumes(pool, 1, 0)
		return vols, err
	})
	if err != nil {
		return nil, classify("listing the volumes of pool "+pool.Name+" on host "+host, err)
	}
	out := make(map[string]libvirt.StorageVol, len(vols))
	for _, v := range vols {
		out[v.Name] = v
	}
	return out, nil
}

// listVolumes is poolVolumes on the host's pool after a refresh (files
// may have changed behind libvirt's back). A pool that does not exist
// holds nothing.
func (p *Provider) listVolumes(ctx context.Context, h *Host) (map[string]libvirt.StorageVol, error) {
	pool, err := p.lookupPool(ctx, h.Name, h.Pool)
	if isCode(err, libvirt.ErrNoStoragePool) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := p.rpc(ctx, h.Name, "StoragePoolRefresh", func(a api) error { return a.StoragePoolRefresh(pool, 0) }); err != nil {
		return nil, classify("refreshing pool "+pool.Name, err)
	}
	return p.poolVolumes(ctx, h.Name, pool)
}
