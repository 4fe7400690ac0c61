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
//
// Many objects at once (a tenant creating thousands of bad Services) are
// bounded by the node as a whole: EventNodeBurst, then EventNodeRate a
// second, which is the Events client's own QPS. client-go's recorder
// starts a goroutine per Event that waits for that client's limiter and
// retries for up to about two minutes when the API server is away, so the
// goroutines it holds are at most EventNodeBurst plus two minutes of
// EventNodeRate, whatever the tenants do. Dropped Events are counted in
// xvs_events_dropped_total.
const (
	EventBurst     = 5
	EventEvery     = time.Minute
	EventNodeRate  = eventsQPS
	EventNodeBurst = 2 * eventsAPIBurst
	// eventObjects bounds the limiter's memory: beyond it, objects whose
	// bucket has refilled are forgotten (a forgotten object starts again
	// with a full burst, which its idleness has earned anyway), and while
	// every remembered object is still within its interval a new object
	// gets no Event, as if it were over its share.
	eventObjects = 4096
)

type eventLimiter struct {
	mu    sync.Mutex
	burst int
	every time.Duration
	node  *rate.Limiter
	objs  map[string]*rate.Limiter
}

func newEventLimiter(burst int, every time.Duration, nodeRate float64, nodeBurst int) *eventLimiter {
	return &eventLimiter{burst: burst, every: every, node: rate.NewLimiter(rate.Limit(nodeRate), nodeBurst),
		objs: map[string]*rate.Limiter{}}
}

// allow says whether an Event about key (kind/namespace/name) may be
// recorded at now. An Event the object's share allows but the node's does
// not still uses the object's share.
func (l *eventLimiter) allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.objs[key]
	if !ok {
		if len(l.objs) >= eventObjects {
			l.forget(now)
		}
		if len(l.objs) >= eventObjects {
			return false
		}
		lim = rate.NewLimiter(rate.Every(l.every), l.burst)
		l.objs[key] = lim
	}
	return lim.AllowN(now, 1) && l.node.AllowN(now, 1)
}

// forget drops the objects whose bucket has refilled.
func (l *eventLimiter) forget(now time.Time) {
	for k, o := range l.objs {
		if o.TokensAt(now) >= float64(l.burst) {
			delete(l.objs, k)
		}
	}
}
