package conformance

import (
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	ebpf := &Results{Mode: ModeEBPF, Kernel: "6.12", Passed: 3, Failed: 1, Scenarios: []ScenarioResult{
		{Name: "a", Sections: []string{"3.10", "3.2"}, Status: StatusPass, Probes: []ProbeResult{{Probe: "p", Pass: true}, {Probe: "q", Pass: true}}},
		{Name: "b", Sections: []string{"3.2"}, Status: StatusFail, Probes: []ProbeResult{{Probe: "r", Pass: true}, {Probe: "s|t", Expected: "REJECT", Observed: "DROP×1", Step: 2}}},
		{Name: "c", Status: StatusMalformed, Error: "unknown field \"x\""},
		{Name: "d", Sections: []string{"3.20"}, Status: StatusFail, Probes: []ProbeResult{{Probe: "p", Pass: true},
			{Probe: "agent /healthz", Agent: true}, {Probe: "agent /livez", Agent: true, Pass: true}}},
		{Name: "e", Sections: []string{"3.5"}, Status: StatusFail, Probes: []ProbeResult{{Probe: "p", Pass: true},
			{Probe: "agent /metrics sync", Agent: true}}},
	}}
	ipvs := &Results{Mode: ModeIPVS, Kernel: "6.1", Scenarios: []ScenarioResult{
		{Name: "a", Sections: []string{"3.10", "3.2"}, Status: StatusSkip},
	}}
	md := string(Report([]*Results{ebpf, ipvs}, "", nil))
	for _, want := range []string{
		"| 3.2 ClusterIP | 1/2 (3/4) | 0/0 (0/0) |",
		"| 3.10 Ready, serving, terminating | 1/1 (2/2) ✅ | 0/0 (0/0) |",
		"| (no section named) | 0/1 (0/0) | 0/0 (0/0) |",
		"| b | 3.2 | fail 1/2 | — |",
		"| a | 3.10, 3.2 | pass 2/2 | skip |",
		`| b | step 2: s\|t | REJECT | DROP×1 |`,
		`| c | (malformed) | | unknown field "x" |`,
		"| agent /healthz | 0/1 | 0/0 |",
		"| agent /livez | 1/1 ✅ | 0/0 |",
		"| 3.20 The proxy's own endpoints | 0/1 (2/3) | 0/0 (0/0) |",
		"| 3.5 LoadBalancer ingress IPs | 1/1 (1/1) ✅ | 0/0 (0/0) |", // its failing check is 3.21's
		"| agent /metrics sync | 0/1 | 0/0 |",
		"ebpf @ 6.12", "ipvs @ 6.1",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	// 3.2 sorts before 3.10.
	if strings.Index(md, "| 3.2 ") > strings.Index(md, "| 3.10 ") {
		t.Error("sections not in numeric order")
	}
}
