package agent

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Events are written for input tenants control (a bad annotation, a port
// clash), so they are bounded per object: a tenant editing an annotation
// ten times a second must not turn every node into an Event storm, nor
// queue a goroutine per Event in the recorder. Each object gets a burst of
// EventBurst, then one Event per EventEvery (the core events API's spam
// filter gives 25, then one per 5 minutes; Events here are rarer).
// Dropped Events are counted in xvs_events_dropped_total.
const (
	EventBurst = 5
	EventEvery = time.Minute
	// eventObjects bounds the limiter's memory: beyond it, objects whose
	// bucket has refilled are forgotten (a forgotten object starts again
	// with a full burst, which its idleness has earned anyway).
	eventObjects = 4096
)

type eventLimiter struct {
	mu    sync.Mutex
	burst int
	every time.Duration
	objs  map[string]*rate.Limiter
}

func newEventLimiter(burst int, every time.Duration) *eventLimiter {
	return &eventLimiter{burst: burst, every: every, objs: map[string]*rate.Limiter{}}
}

// allow says whether an Event about key (kind/namespace/name) may be
// recorded at now.
func (l *eventLimiter) allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.objs[key]
	if !ok {
		if len(l.objs) >= eventObjects {
			for k, o := range l.objs {
				if o.TokensAt(now) >= float64(l.burst) {
					delete(l.objs, k)
				}
			}
		}
		lim = rate.NewLimiter(rate.Every(l.every), l.burst)
		l.objs[key] = lim
	}
	return lim.AllowN(now, 1)
}
