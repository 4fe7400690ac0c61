// Package runner is a bounded-frequency runner, as kube-proxy's sync loop
// uses: a function that runs when asked, but at most once per MinInterval
// (measured from the end of the previous run), at least once per
// MaxInterval, and again after RetryInterval when it fails.
package runner

import (
	"context"
	"time"
)

// Config of a Runner.
type Config struct {
	// MinInterval is minSyncPeriod: the least time between the end of a run
	// and the start of the next.
	MinInterval time.Duration
	// MaxInterval is syncPeriod: the longest time without a run.
	MaxInterval time.Duration
	// RetryInterval is the wait after a failed run.
	RetryInterval time.Duration
}

// Runner calls fn under the Config's bounds.
type Runner struct {
	cfg     Config
	fn      func(context.Context) error
	trigger chan struct{}
}

// New returns a Runner for fn.
func New(cfg Config, fn func(context.Context) error) *Runner {
	if cfg.MaxInterval <= 0 {
		cfg.MaxInterval = time.Hour
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = time.Second
	}
	return &Runner{cfg: cfg, fn: fn, trigger: make(chan struct{}, 1)}
}

// Run asks for a run; requests made while one is pending collapse into it.
func (r *Runner) Run() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Loop runs until ctx ends. The first run happens only once Run is called,
// so the caller decides when the inputs are ready (informers synced).
func (r *Runner) Loop(ctx context.Context) {
	periodic := time.NewTimer(r.cfg.MaxInterval)
	defer periodic.Stop()
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.trigger:
		case <-periodic.C:
		case <-retry:
		}
		err := r.fn(ctx)
		retry = nil
		if err != nil && ctx.Err() == nil {
			retry = time.After(r.cfg.RetryInterval)
		}
		periodic.Reset(r.cfg.MaxInterval)
		if r.cfg.MinInterval > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(r.cfg.MinInterval):
			}
		}
	}
}
