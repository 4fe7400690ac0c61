package ipvs

import (
	"errors"
	"net/netip"
	"slices"
	"time"

	"github.com/xvs-lb/xvs/model"
)

// Real servers: the reconciliation of one virtual server's, and the drain
// of removed TCP ones that still carry connections.

// syncReals reconciles the real servers of one virtual server. A removed
// TCP real server with connections goes to weight 0 and drains; UDP and
// SCTP ones, and idle TCP ones, are deleted at once (kube-proxy's
// graceful_termination.go; expire_nodest_conn ends their flows).
func (d *Datapath) syncReals(vs *virtualServer, existed bool) error {
	var have []kReal
	if existed {
		var err error
		if have, err = d.k.Reals(vs.Key); err != nil {
			return err
		}
	}
	var errs []error
	haveBy := map[rsKey]kReal{}
	for _, r := range have {
		haveBy[r.Key] = r
	}
	keys := make([]rsKey, 0, len(vs.Reals))
	for r := range vs.Reals {
		keys = append(keys, r)
	}
	slices.SortFunc(keys, func(a, b rsKey) int {
		return netip.AddrPortFrom(a.Addr, a.Port).Compare(netip.AddrPortFrom(b.Addr, b.Port))
	})
	for _, r := range keys {
		w := vs.Reals[r]
		cur, ok := haveBy[r]
		switch {
		case !ok:
			if err := d.k.AddReal(vs.Key, kReal{Key: r, Weight: w}); err != nil {
				errs = append(errs, err)
			}
		case cur.Weight != w:
			// Also brings back a draining real server that is wanted again.
			if err := d.k.UpdateReal(vs.Key, kReal{Key: r, Weight: w}); err != nil {
				errs = append(errs, err)
			}
		}
		d.undrain(vs.Key, r)
	}
	for _, cur := range have {
		if _, ok := vs.Reals[cur.Key]; ok {
			continue
		}
		if err := d.retire(vs.Key, cur); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// retire removes a real server, gracefully for TCP with connections.
func (d *Datapath) retire(k vsKey, r kReal) error {
	if k.Proto != model.TCP || r.Active+r.Inactive == 0 {
		d.undrain(k, r.Key)
		return d.k.DelReal(k, r.Key)
	}
	if r.Weight != 0 {
		if err := d.k.UpdateReal(k, kReal{Key: r.Key, Weight: 0}); err != nil {
			return err
		}
	}
	if d.draining[k] == nil {
		d.draining[k] = map[rsKey]time.Time{}
	}
	if _, ok := d.draining[k][r.Key]; !ok {
		d.draining[k][r.Key] = time.Now()
		d.cfg.Log.Info("real server draining", "service", k.String(), "real", r.Key.String(),
			"active", r.Active, "inactive", r.Inactive)
	}
	return nil
}

func (d *Datapath) undrain(k vsKey, r rsKey) {
	if m := d.draining[k]; m != nil {
		delete(m, r)
		if len(m) == 0 {
			delete(d.draining, k)
		}
	}
}

func (d *Datapath) drainLoop() {
	defer close(d.done)
	t := time.NewTicker(d.cfg.DrainInterval)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			if err := d.drain(); err != nil {
				d.cfg.Log.Warn("graceful termination", "err", err)
			}
		}
	}
}

// drain deletes the draining real servers whose connections have ended.
func (d *Datapath) drain() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for k, reals := range d.draining {
		have, err := d.k.Reals(k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for r := range reals {
			i := slices.IndexFunc(have, func(x kReal) bool { return x.Key == r })
			switch {
			case i < 0 || have[i].Weight > 0:
				// Gone, or wanted again.
				d.undrain(k, r)
			case have[i].Active+have[i].Inactive == 0:
				if err := d.k.DelReal(k, r); err != nil {
					errs = append(errs, err)
					continue
				}
				d.cfg.Log.Info("real server drained", "service", k.String(), "real", r.String())
				d.undrain(k, r)
			}
		}
	}
	return errors.Join(errs...)
}

// Draining reports the real servers waiting at weight 0, as "VS -> RS".
func (d *Datapath) Draining() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for k, reals := range d.draining {
		for r := range reals {
			out = append(out, k.String()+" -> "+r.String())
		}
	}
	slices.Sort(out)
	return out
}
