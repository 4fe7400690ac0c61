package agent

import (
	"fmt"
	"testing"
	"time"
)

// TestEventLimiter: an object gets its burst, then one Event per interval;
// other objects are not held back by it; the table stays bounded.
func TestEventLimiter(t *testing.T) {
	l := newEventLimiter(5, time.Minute)
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
