package ipvs

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/xvs-lb/xvs/model"
	"golang.org/x/sys/unix"
)

// What xvs records of the IPVS state it creates, per network namespace:
// all it ever removes is what the record names.

func defaultStateFile() string { return NamespaceFile("ipvs-state") } // among NamespaceFilePrefixes

// NamespaceFile is StateDir/<prefix>-<inode of the caller's network
// namespace>.json: xvs's records are per namespace, as what they describe
// is (IPVS, and an agent's Services).
func NamespaceFile(prefix string) string {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return filepath.Join(StateDir, prefix+".json")
	}
	return NamespaceFileOf(prefix, st.Ino)
}

// NamespaceFileOf is NamespaceFile for the namespace of inode ino.
func NamespaceFileOf(prefix string, ino uint64) string {
	return filepath.Join(StateDir, fmt.Sprintf("%s-%d.json", prefix, ino))
}

// NamespaceFilePrefixes are the records NamespaceFile names: the IPVS
// mode's state, and the agent's Services file (agent/publish.go). What
// removes a namespace removes them too (conformance's stale cleanup).
var NamespaceFilePrefixes = []string{"ipvs-state", "services"}

// HasState reports whether xvs's IPVS mode left state in the caller's
// network namespace: its state file, the record of what it created (a
// kube-ipvs0 alone is kube-proxy's). It does not load ip_vs.
func HasState(cfg Config) bool {
	cfg.defaults()
	_, err := os.Stat(cfg.StateFile)
	return err == nil
}

// stateRecord is the StateFile's content: what xvs created, which is all
// it ever removes.
type stateRecord struct {
	Servers []string `json:"virtualServers"`
	// VIPs are the addresses xvs bound to the dummy interface. A record
	// written before they were recorded has none: the addresses of its
	// virtual servers stand for them.
	VIPs []string `json:"vips,omitempty"`
	// CreatedDevice: xvs created the dummy interface (it was not there,
	// say from kube-proxy's IPVS mode, before).
	CreatedDevice bool `json:"createdDevice,omitempty"`
}

// loadOwned reads the state file. Only what it records is xvs's.
func (d *Datapath) loadOwned() error {
	b, err := os.ReadFile(d.cfg.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", d.cfg.StateFile, err)
	}
	var rec stateRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		d.cfg.Log.Warn("ignoring unreadable IPVS state file", "path", d.cfg.StateFile, "err", err)
	}
	for _, s := range rec.Servers {
		if k, err := parseVSKey(s); err == nil {
			d.owned[k] = true
			if rec.VIPs == nil {
				d.ownedVIPs[k.Addr] = true
			}
		}
	}
	for _, s := range rec.VIPs {
		if a, err := netip.ParseAddr(s); err == nil {
			d.ownedVIPs[a.Unmap()] = true
		}
	}
	d.createdDevice = d.createdDevice || rec.CreatedDevice
	return nil
}

func (d *Datapath) saveOwned() error {
	rec := stateRecord{Servers: []string{}}
	keys := make([]vsKey, 0, len(d.owned))
	for k := range d.owned {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, vsKey.compare)
	for _, k := range keys {
		rec.Servers = append(rec.Servers, k.String())
	}
	rec.VIPs = []string{}
	for _, a := range slices.SortedFunc(maps.Keys(d.ownedVIPs), netip.Addr.Compare) {
		rec.VIPs = append(rec.VIPs, a.String())
	}
	rec.CreatedDevice = d.createdDevice
	b, _ := json.MarshalIndent(rec, "", "  ")
	if err := os.MkdirAll(filepath.Dir(d.cfg.StateFile), 0o755); err != nil {
		return err
	}
	tmp := d.cfg.StateFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write IPVS state file: %w", err)
	}
	return os.Rename(tmp, d.cfg.StateFile)
}

func parseVSKey(s string) (vsKey, error) {
	var proto, ap string
	if _, err := fmt.Sscan(s, &proto, &ap); err != nil {
		return vsKey{}, fmt.Errorf("bad virtual server %q", s)
	}
	p, err := model.ParseProtocol(proto)
	if err != nil {
		return vsKey{}, err
	}
	a, err := netip.ParseAddrPort(ap)
	if err != nil {
		return vsKey{}, err
	}
	return vsKey{Addr: a.Addr(), Proto: p, Port: a.Port()}, nil
}
