package agent

import (
	"fmt"
	"testing"
	"time"
)

// TestEventLimiter: an object gets its burst, then one Event per interval;
// other objects are not held back by it; the table stays bounded.
func TestEventLimiter(t *testing.T) {
	l := newEventLimiter(5, time.Minute, 1e9, 1e9)
	now := time.Unix(1_000_000, 0)
	allowed := 0
	for i := range 100 { // ten edits a second for ten seconds
		if l.allow("Service/ns/noisy", now.Add(time.Duration(i)*100*time.Millisecond)) {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("%d of 100 Events about one object allowed in 10 s, want the burst of 5", allowed)
	}
	if !l.allow("Service/ns/quiet", now.Add(10*time.Second)) {
		t.Fatal("another object's first Event was held back")
	}
	if !l.allow("Service/ns/noisy", now.Add(10*time.Second+time.Minute)) {
		t.Fatal("no Event a minute later")
	}
	for i := range 3 * eventObjects {
		l.allow(fmt.Sprintf("Service/ns/s%d", i), now.Add(time.Duration(i)*time.Hour))
	}
	if n := len(l.objs); n > eventObjects+1 {
		t.Fatalf("%d objects remembered, want at most %d", n, eventObjects+1)
	}
}

// TestEventLimiterNode: thousands of objects, each within its own share,
// get no more Events from the node than the node's burst and rate (the
// goroutines client-go's recorder holds stay bounded); a noisy object over
// its share does not use up the node's; and the table stays bounded when
// no object's bucket has refilled yet.
func TestEventLimiterNode(t *testing.T) {
	l := newEventLimiter(EventBurst, EventEvery, EventNodeRate, EventNodeBurst)
	now := time.Unix(1_000_000, 0)
	for range 100 {
		l.allow("Service/ns/noisy", now)
	}
	allowed := 0
	for i := range 1000 {
		if l.allow(fmt.Sprintf("Service/ns/s%d", i), now) {
			allowed++
		}
	}
	if want := EventNodeBurst - EventBurst; allowed != want {
		t.Fatalf("%d Events about 1000 objects at once, want the node's burst less the noisy object's share (%d)", allowed, want)
	}
	allowed = 0
	for i := range 10_000 { // 1000 objects a second for ten seconds
		if l.allow(fmt.Sprintf("Service/other/s%d", i), now.Add(time.Duration(i)*time.Millisecond)) {
			allowed++
		}
	}
	if max := 10 * EventNodeRate; allowed > max {
		t.Fatalf("%d Events in 10 s, want at most %d (the node's rate)", allowed, max)
	}

	l = newEventLimiter(EventBurst, EventEvery, 1e9, 1e9)
	for i := range 3 * eventObjects {
		l.allow(fmt.Sprintf("Service/ns/s%d", i), now)
	}
	if n := len(l.objs); n > eventObjects {
		t.Fatalf("%d objects remembered while none had refilled, want at most %d", n, eventObjects)
	}
	if !l.allow("Service/ns/s0", now.Add(EventEvery)) || l.allow("Service/ns/late", now.Add(time.Second)) {
		t.Fatal("a remembered object keeps its share; a new one waits while the table is full")
	}
}
