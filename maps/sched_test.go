package maps

import (
	"testing"

	"github.com/xvs-lb/xvs/model"
)

// TestSchedulersMatchTheModel: the datapath has an enum for exactly the
// schedulers model.Schedulers says the BPF datapath implements.
func TestSchedulersMatchTheModel(t *testing.T) {
	bpf := 0
	for _, s := range model.Schedulers {
		_, err := SchedulerByName(s.Name)
		if s.BPF {
			bpf++
		}
		if (err == nil) != s.BPF {
			t.Errorf("scheduler %q: in the BPF datapath %v, model says %v", s.Name, err == nil, s.BPF)
		}
	}
	if len(schedulers) != bpf {
		t.Errorf("the datapath has %d scheduler names, the model %d", len(schedulers), bpf)
	}
}
