package runner

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunCollapsesAndRespectsMinInterval(t *testing.T) {
	var runs atomic.Int32
	var starts []time.Time
	done := make(chan struct{}, 10)
	r := New(Config{MinInterval: 200 * time.Millisecond, MaxInterval: time.Hour}, func(context.Context) error {
		runs.Add(1)
		starts = append(starts, time.Now())
		done <- struct{}{}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Loop(ctx)
	r.Run()
	<-done
	for range 5 {
		r.Run() // all collapse into one pending run
	}
	<-done
	time.Sleep(300 * time.Millisecond)
	if n := runs.Load(); n != 2 {
		t.Fatalf("runs = %d, want 2", n)
	}
	if gap := starts[1].Sub(starts[0]); gap < 200*time.Millisecond {
		t.Fatalf("second run %v after the first, want >= MinInterval", gap)
	}
}

func TestRetryAfterFailureAndPeriodic(t *testing.T) {
	var runs atomic.Int32
	done := make(chan struct{}, 10)
	r := New(Config{MaxInterval: 150 * time.Millisecond, RetryInterval: 20 * time.Millisecond}, func(context.Context) error {
		n := runs.Add(1)
		done <- struct{}{}
		if n == 1 {
			return errors.New("boom")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Loop(ctx)
	r.Run()
	for range 3 { // first run, retry, then a periodic run
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Fatalf("only %d runs", runs.Load())
		}
	}
}

// TestRetryBacksOff: a run that keeps failing is retried after 1, 2, 4, ...
// times RetryInterval, never more than MaxRetryInterval apart, and from
// RetryInterval again after a success.
func TestRetryBacksOff(t *testing.T) {
	r := New(Config{RetryInterval: time.Second, MaxRetryInterval: 10 * time.Second}, nil)
	var got []time.Duration
	for n := range 6 {
		got = append(got, r.RetryAfter(n))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	if d := New(Config{RetryInterval: time.Minute}, nil).RetryAfter(3); d != time.Minute {
		t.Fatalf("a cap below RetryInterval: wait %v, want RetryInterval", d)
	}

	// In the loop: failures 1-4 in a row, a success, then (asked for)
	// a failure, whose retry waits RetryInterval again.
	var runs atomic.Int32
	var mu sync.Mutex
	var starts []time.Time
	done := make(chan struct{}, 16)
	r = New(Config{MaxInterval: time.Hour, RetryInterval: 40 * time.Millisecond, MaxRetryInterval: 2 * time.Second},
		func(context.Context) error {
			n := runs.Add(1)
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			done <- struct{}{}
			if n <= 4 || n == 6 {
				return errors.New("boom")
			}
			return nil
		})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Loop(ctx)
	wait := func(runs int) {
		for range runs {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("a run did not come")
			}
		}
	}
	r.Run()
	wait(5)
	r.Run()
	wait(2)
	mu.Lock()
	defer mu.Unlock()
	// Gaps after failures 1-4: at least 40, 80, 160, 320 ms.
	for i, least := range []time.Duration{40, 80, 160, 320} {
		if gap := starts[i+1].Sub(starts[i]); gap < least*time.Millisecond {
			t.Fatalf("retry %d came %v after its failure, want >= %v ms", i+1, gap, least)
		}
	}
	// After the success the wait starts again from 40 ms, far below the
	// 640 ms a fifth failure in a row would wait.
	if gap := starts[6].Sub(starts[5]); gap < 40*time.Millisecond || gap >= 500*time.Millisecond {
		t.Fatalf("the retry after a success came %v after its failure, want 40 ms (not 640)", gap)
	}
}
