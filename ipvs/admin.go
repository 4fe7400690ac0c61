package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	mobyipvs "github.com/moby/ipvs"

	"github.com/xvs-lb/xvs/model"
)

func setTimeouts(k *mobyKernel, cfg Config) error {
	if cfg.TCPTimeout == 0 && cfg.TCPFinTimeout == 0 && cfg.UDPTimeout == 0 {
		return nil
	}
	// The kernel leaves a timeout of 0 unchanged, as ipvsadm --set does.
	c := &mobyipvs.Config{TimeoutTCP: cfg.TCPTimeout, TimeoutTCPFin: cfg.TCPFinTimeout, TimeoutUDP: cfg.UDPTimeout}
	if err := k.h.SetConfig(c); err != nil {
		return fmt.Errorf("set IPVS timeouts: %w", err)
	}
	return nil
}

// Cleanup removes what xvs's IPVS mode created in the caller's network
// namespace, as its state file records it: its virtual servers, the
// addresses it bound to the dummy interface, that interface if xvs created
// it and nothing else is on it, its nftables tables and the state file.
// kube-proxy's virtual servers and kube-ipvs0 stay. A kernel without IPVS
// has nothing of it to clean; the rules are still removed.
func Cleanup(cfg Config) error {
	cfg.defaults()
	var errs []error
	if Available() == nil {
		mk, err := newMobyKernel(cfg.Device)
		if err != nil {
			return err
		}
		defer mk.Close()
		errs = append(errs, cleanupKernel(cfg, mk))
	}
	if err := (nftRules{}).Delete(); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(cfg.StateFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// recordOf is a Datapath for reading the state file only (List, Cleanup).
func recordOf(cfg Config, k kernel) *Datapath {
	return &Datapath{cfg: cfg, k: k, owned: map[vsKey]bool{}, ownedVIPs: map[netip.Addr]bool{}}
}

// cleanupKernel removes the recorded virtual servers and addresses, and
// the interface when xvs created it and it is empty now.
func cleanupKernel(cfg Config, k kernel) error {
	d := recordOf(cfg, k)
	if err := d.loadOwned(); err != nil {
		return err
	}
	var errs []error
	have, err := k.Services()
	if err != nil {
		errs = append(errs, err)
	}
	for _, s := range have {
		if d.owned[s.Key] && !d.excluded(s.Key.Addr) {
			if err := k.DelService(s.Key); err != nil {
				errs = append(errs, err)
			}
		}
	}
	onDev, err := k.DeviceAddrs()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	left := 0
	for _, a := range onDev {
		if !d.ownedVIPs[a] || d.excluded(a) {
			left++
			continue
		}
		if err := k.DelDeviceAddr(a); err != nil {
			errs = append(errs, err)
			left++
		}
	}
	if d.createdDevice && left == 0 {
		if err := k.DeleteDevice(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ServiceView is one virtual server as `xvs list` shows it.
type ServiceView struct {
	Protocol   model.Protocol
	Address    netip.AddrPort
	Scheduler  string
	Persistent bool
	Timeout    uint32
	Flags      uint32
	Reals      []RealView
	Stats      mobyipvs.SvcStats
}

// RealView is one real server.
type RealView struct {
	Address       netip.AddrPort
	Weight        int
	ActiveConns   int
	InactiveConns int
	Stats         mobyipvs.SvcStats
}

// List reads from the kernel the virtual servers xvs created (as its state
// file records them), in address order.
func List(cfg Config) ([]ServiceView, error) {
	cfg.defaults()
	mk, err := newMobyKernel(cfg.Device)
	if err != nil {
		return nil, err
	}
	defer mk.Close()
	return listKernel(cfg, mk)
}

func listKernel(cfg Config, mk kernel) ([]ServiceView, error) {
	d := recordOf(cfg, mk)
	if err := d.loadOwned(); err != nil {
		return nil, err
	}
	have, err := mk.Services()
	if err != nil {
		return nil, err
	}
	slices.SortFunc(have, func(a, b kService) int { return a.Key.compare(b.Key) })
	var out []ServiceView
	for _, s := range have {
		if !d.owned[s.Key] {
			continue
		}
		v := ServiceView{
			Protocol: s.Key.Proto, Address: netip.AddrPortFrom(s.Key.Addr, s.Key.Port),
			Scheduler: s.Scheduler, Persistent: s.Flags&flagPersistent != 0, Timeout: s.Timeout,
			Flags: s.Flags, Stats: s.Stats,
		}
		reals, err := mk.Reals(s.Key)
		if err != nil {
			return nil, err
		}
		slices.SortFunc(reals, func(a, b kReal) int {
			return netip.AddrPortFrom(a.Key.Addr, a.Key.Port).Compare(netip.AddrPortFrom(b.Key.Addr, b.Key.Port))
		})
		for _, r := range reals {
			v.Reals = append(v.Reals, RealView{
				Address: netip.AddrPortFrom(r.Key.Addr, r.Key.Port), Weight: r.Weight,
				ActiveConns: r.Active, InactiveConns: r.Inactive, Stats: r.Stats,
			})
		}
		out = append(out, v)
	}
	return out, nil
}
