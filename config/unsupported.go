package config

import (
	"fmt"
	"sort"
	"time"

	kpv1 "k8s.io/kube-proxy/config/v1alpha1"
)

// Finding is one configuration field that is set but has no effect in xvs.
type Finding struct {
	// Field is the KubeProxyConfiguration path, e.g. "nftables.masqueradeBit".
	Field string
	// Value is what the configuration says.
	Value string
	// Reason says why xvs does not honour it, and what it does instead.
	Reason string
}

func (f Finding) String() string { return fmt.Sprintf("%s=%s: %s", f.Field, f.Value, f.Reason) }

// KnownFeatureGates are the kube-proxy v1.37 feature gates whose
// behaviour xvs has built in, with the value that matches it. Setting one
// of them to that value changes nothing; the other value, or any other
// gate, is a Finding. (ServiceTrafficDistribution, ProxyTerminatingEndpoints
// and KubeProxyDrainingTerminatingNodes are GA and removed from v1.37,
// which refuses them; xvs has their behaviour and reports them.)
var KnownFeatureGates = map[string]bool{
	// KEP-3015: PreferSameNode hints are honoured (GA, locked on, since
	// v1.35).
	"PreferSameTrafficDistribution": true,
}

// SwitchableFeatureGates are the kube-proxy v1.37 gates xvs honours either
// way, with their default and stage: the z-pages of the metrics server
// (component-base's ComponentFlagz and ComponentStatusz, beta and on since
// v1.36), which kube-proxy installs only while they are on.
var SwitchableFeatureGates = map[string]struct {
	Default bool
	Stage   string
}{
	"ComponentFlagz":   {true, "BETA"},
	"ComponentStatusz": {true, "BETA"},
}

// FeatureEnabled is a SwitchableFeatureGates gate's value in c: what
// featureGates says, else its default.
func FeatureEnabled(c *kpv1.KubeProxyConfiguration, name string) bool {
	if v, ok := c.FeatureGates[name]; ok {
		return v
	}
	return SwitchableFeatureGates[name].Default
}

// Unsupported lists every field of c that xvs does not honour in the
// configured mode and that is set to something other than kube-proxy's
// default or zero value. c should be defaulted (SetDefaults) first. The
// list is sorted by field. Long by design: one check per configuration
// field, in KubeProxyConfiguration's order, so a field's line is found by
// its name.
func Unsupported(c *kpv1.KubeProxyConfiguration) []Finding {
	var out []Finding
	add := func(field string, value any, reason string) {
		out = append(out, Finding{Field: field, Value: fmt.Sprint(value), Reason: reason})
	}
	dur := func(field string, d time.Duration, def time.Duration, reason string) {
		if d != 0 && d != def {
			add(field, d, reason)
		}
	}

	// Other modes' sections. kube-proxy's IPVS mode reads
	// iptables.masqueradeAll (honoured) and nothing else of iptables.*.
	const iptOnly = "iptables mode only; xvs has no iptables rules"
	if b := c.IPTables.MasqueradeBit; b != nil && *b != 14 {
		add("iptables.masqueradeBit", *b, "xvs marks with bit 14 (0x4000) only, kube-proxy's default: its netfilter mode masquerades by that bit, its bypass mode without a mark")
	}
	if p := c.IPTables.LocalhostNodePorts; p != nil && *p {
		add("iptables.localhostNodePorts", *p, "NodePorts are never served on localhost (nftables and IPVS parity, CVE-2020-8558)")
	}
	dur("iptables.syncPeriod", c.IPTables.SyncPeriod.Duration, 30*time.Second, iptOnly+"; use ipvs.syncPeriod")
	dur("iptables.minSyncPeriod", c.IPTables.MinSyncPeriod.Duration, time.Second, iptOnly+"; use ipvs.minSyncPeriod")

	const nftOnly = "nftables mode only; use ipvs.* and iptables.masqueradeAll, which xvs reads in every mode"
	if b := c.NFTables.MasqueradeBit; b != nil && *b != 14 {
		add("nftables.masqueradeBit", *b, nftOnly)
	}
	if c.NFTables.MasqueradeAll {
		add("nftables.masqueradeAll", true, nftOnly)
	}
	dur("nftables.syncPeriod", c.NFTables.SyncPeriod.Duration, 30*time.Second, nftOnly)
	dur("nftables.minSyncPeriod", c.NFTables.MinSyncPeriod.Duration, time.Second, nftOnly)

	w := c.Winkernel
	for _, f := range []struct {
		name string
		set  bool
		v    any
	}{
		{"winkernel.networkName", w.NetworkName != "", w.NetworkName},
		{"winkernel.sourceVip", w.SourceVip != "", w.SourceVip},
		{"winkernel.enableDSR", w.EnableDSR, w.EnableDSR},
		{"winkernel.rootHnsEndpointName", w.RootHnsEndpointName != "", w.RootHnsEndpointName},
		{"winkernel.forwardHealthCheckVip", w.ForwardHealthCheckVip, w.ForwardHealthCheckVip},
		{"windowsRunAsService", c.WindowsRunAsService, c.WindowsRunAsService},
	} {
		if f.set {
			add(f.name, f.v, "Windows only")
		}
	}

	// IPVS-only knobs have no meaning for the eBPF datapath; in ipvs mode
	// the IPVS datapath reads them.
	if c.Mode == ModeEBPF {
		const ipvsOnly = "kernel IPVS only (mode: ipvs); the eBPF datapath has its own conntrack and no IPVS virtual servers"
		if len(c.IPVS.ExcludeCIDRs) > 0 {
			add("ipvs.excludeCIDRs", c.IPVS.ExcludeCIDRs, ipvsOnly)
		}
		if c.IPVS.StrictARP {
			add("ipvs.strictARP", true, ipvsOnly+" (xvs puts no VIP on a dummy interface, so nothing answers ARP for it)")
		}
		dur("ipvs.tcpTimeout", c.IPVS.TCPTimeout.Duration, 0, ipvsOnly)
		dur("ipvs.tcpFinTimeout", c.IPVS.TCPFinTimeout.Duration, 0, ipvsOnly)
		dur("ipvs.udpTimeout", c.IPVS.UDPTimeout.Duration, 0, ipvsOnly)
	}

	// Local-traffic detection: the eBPF datapath classifies sources by
	// clusterCIDR only.
	switch c.DetectLocalMode {
	case "", "ClusterCIDR":
	default:
		add("detectLocalMode", c.DetectLocalMode, "only ClusterCIDR is implemented: sources are local when inside clusterCIDR")
	}
	if c.DetectLocal.BridgeInterface != "" {
		add("detectLocal.bridgeInterface", c.DetectLocal.BridgeInterface, "detectLocalMode BridgeInterface is not implemented")
	}
	if c.DetectLocal.InterfaceNamePrefix != "" {
		add("detectLocal.interfaceNamePrefix", c.DetectLocal.InterfaceNamePrefix, "detectLocalMode InterfaceNamePrefix is not implemented")
	}

	// Host conntrack sysctls: set at start as kube-proxy sets them
	// (agent/conntrack_sysctl.go); the timeouts drive the BPF conntrack
	// in ebpf mode too (loader.CTTimeouts).

	for name, v := range c.FeatureGates {
		want, known := KnownFeatureGates[name]
		_, switchable := SwitchableFeatureGates[name]
		switch {
		case switchable:
		case !known:
			add("featureGates."+name, v, "not a kube-proxy v1.37 gate xvs knows; its behaviour is whatever docs/configuration.md says")
		case v != want:
			add("featureGates."+name, v, fmt.Sprintf("xvs always behaves as with %s=%v", name, want))
		}
	}

	if c.ShowHiddenMetricsForVersion != "" {
		add("showHiddenMetricsForVersion", c.ShowHiddenMetricsForVersion, "xvs hides no metrics")
	}
	if c.PortRange != "" {
		add("portRange", c.PortRange, "unused by kube-proxy too (userspace mode is gone)")
	}
	if c.ClientConnection.AcceptContentTypes != "" {
		add("clientConnection.acceptContentTypes", c.ClientConnection.AcceptContentTypes, "xvs uses contentType only")
	}
	// logging.*: component-base applies all of it (agent.NewLogger), as in
	// kube-proxy.
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}
