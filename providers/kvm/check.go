package kvm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/digitalocean/go-libvirt"

	"github.com/proxyfleet/proxyfleet/providers"
)

// Health check reasons.
const (
	ReasonOK           = "OK"
	ReasonUnreachable  = "Unreachable"
	ReasonAuthFailed   = "AuthFailed"
	ReasonPoolMissing  = "PoolMissing"
	ReasonPoolInactive = "PoolInactive"
	ReasonTimeout      = "Timeout"
	ReasonError        = "Error"
)

// Check checks every host concurrently, each on a fresh connection dialled
// for the check and closed after it: the SSH files are read again (so a
// rotated Secret shows at once), and a check that runs out of time closes
// only its own connection, never one a reconcile is using. Per host: the
// libvirt version and hostname prove the daemon answers, then the pool must
// exist and be running; its capacity and free space go in the details.
func (p *Provider) Check(ctx context.Context) []providers.TargetStatus {
	out := make([]providers.TargetStatus, len(p.cfg.Hosts))
	var wg sync.WaitGroup
	for i, h := range p.cfg.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = p.checkHost(ctx, p.hosts[h.Name])
		}()
	}
	wg.Wait()
	return out
}

func (p *Provider) checkHost(ctx context.Context, h *Host) providers.TargetStatus {
	st := providers.TargetStatus{Target: h.Name, Details: map[string]string{"user": p.cfg.User, "pool": h.Pool, "address": h.Address}}
	fail := func(reason string, err error) providers.TargetStatus {
		st.Reason, st.Message = reason, err.Error()
		if ctx.Err() != nil {
			st.Reason = ReasonTimeout
		}
		return st
	}
	l, err := dial(ctx, p.login, h.Name, h.Address, p.cfg.Budgets.Dial)
	if err != nil {
		if errors.Is(err, providers.ErrPermanent) {
			return fail(ReasonAuthFailed, err)
		}
		return fail(ReasonUnreachable, err)
	}
	defer l.kill("check done")
	type identity struct {
		version  uint64
		hostname string
	}
	id, err := runV(ctx, l, "ConnectGetLibVersion", p.cfg.Budgets.RPC, func(a api) (identity, error) {
		v, err := a.ConnectGetLibVersion()
		if err != nil {
			return identity{}, err
		}
		h, err := a.ConnectGetHostname()
		return identity{v, h}, err
	})
	if err != nil {
		return fail(ReasonError, classify("asking libvirt for its version and hostname", err))
	}
	version := id.version
	st.Details["hostname"] = id.hostname
	st.Details["libvirtVersion"] = fmt.Sprintf("%d.%d.%d", version/1000000, version/1000%1000, version%1000)
	type poolInfo struct {
		state           uint8
		capacity, avail uint64
	}
	info, err := runV(ctx, l, "StoragePoolGetInfo", p.cfg.Budgets.RPC, func(a api) (poolInfo, error) {
		pool, err := a.StoragePoolLookupByName(h.Pool)
		if err != nil {
			return poolInfo{}, err
		}
		state, capacity, _, avail, err := a.StoragePoolGetInfo(pool)
		return poolInfo{state, capacity, avail}, err
	})
	if isCode(err, libvirt.ErrNoStoragePool) {
		return fail(ReasonPoolMissing, fmt.Errorf("storage pool %s does not exist on host %s", h.Pool, h.Name))
	}
	if err != nil {
		return fail(ReasonError, classify("reading storage pool "+h.Pool, err))
	}
	state, capacity, avail := info.state, info.capacity, info.avail
	st.Details["poolState"] = poolStateName(libvirt.StoragePoolState(state))
	st.Details["poolCapacityGiB"] = strconv.FormatUint(capacity>>30, 10)
	st.Details["poolAvailableGiB"] = strconv.FormatUint(avail>>30, 10)
	if libvirt.StoragePoolState(state) != libvirt.StoragePoolRunning {
		return fail(ReasonPoolInactive, fmt.Errorf("storage pool %s on host %s is %s, not running", h.Pool, h.Name, st.Details["poolState"]))
	}
	st.Ready, st.Reason, st.Message = true, ReasonOK, "libvirt answers and the pool is running"
	return st
}

func poolStateName(s libvirt.StoragePoolState) string {
	switch s {
	case libvirt.StoragePoolInactive:
		return "inactive"
	case libvirt.StoragePoolBuilding:
		return "building"
	case libvirt.StoragePoolRunning:
		return "running"
	case libvirt.StoragePoolDegraded:
		return "degraded"
	case libvirt.StoragePoolInaccessible:
		return "inaccessible"
	}
	return "unknown"
}
