package runner

import (
	"context"
	"errors"
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
