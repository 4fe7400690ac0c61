// Package runner is a bounded-frequency runner, as kube-proxy's sync loop
// uses: a function that runs when asked, but at most once per MinInterval
// (measured from the end of the previous run), at least once per
// MaxInterval, and again after RetryInterval when it fails, the wait
// doubling with each failure in a row up to MaxRetryInterval.
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
	// RetryInterval is the wait after a failed run; each further failure
	// in a row doubles it, up to MaxRetryInterval (default
	// DefaultMaxRetryInterval, never less than RetryInterval). A success
	// starts again from RetryInterval. A Run request does not wait for it.
	RetryInterval    time.Duration
	MaxRetryInterval time.Duration
}

// DefaultMaxRetryInterval caps the wait between retries of a run that
// keeps failing: a failing full sync of a large cluster, retried every
// second, would keep a core busy and flood the log.
const DefaultMaxRetryInterval = 30 * time.Second

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
	if cfg.MaxRetryInterval <= 0 {
		cfg.MaxRetryInterval = DefaultMaxRetryInterval
	}
	cfg.MaxRetryInterval = max(cfg.MaxRetryInterval, cfg.RetryInterval)
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
	failures := 0
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
		switch {
		case err == nil:
			failures = 0
		case ctx.Err() == nil:
			retry = time.After(r.RetryAfter(failures))
			failures++
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

// RetryAfter is the wait before the retry that follows n earlier failures
// in a row (0: the first failure).
func (r *Runner) RetryAfter(n int) time.Duration {
	d := r.cfg.RetryInterval
	for ; n > 0 && d < r.cfg.MaxRetryInterval; n-- {
		d *= 2
	}
	return min(d, r.cfg.MaxRetryInterval)
}
