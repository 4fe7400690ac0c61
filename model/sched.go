package model

// Scheduler is a scheduler xvs accepts in ipvs.scheduler and the
// xvs.io/scheduler annotation: a kernel IPVS scheduler, or uniform random
// ("" and "random": kube-proxy's iptables and nftables choice).
type Scheduler struct {
	Name string
	// BPF: the ebpf datapath implements it (the ipvs mode has every
	// scheduler its kernel has).
	BPF bool
}

// Schedulers are the accepted schedulers; the one list every package
// checks names against.
var Schedulers = []Scheduler{
	{"", true}, {"random", true},
	{"rr", true}, {"wrr", true}, {"lc", true}, {"wlc", true}, {"sed", true}, {"nq", true},
	{"sh", true}, {"dh", true}, {"mh", true},
	{"lblc", false}, {"lblcr", false}, {"fo", false}, {"ovf", false}, {"twos", false},
}

// LookupScheduler finds a scheduler by name.
func LookupScheduler(name string) (Scheduler, bool) {
	for _, s := range Schedulers {
		if s.Name == name {
			return s, true
		}
	}
	return Scheduler{}, false
}
