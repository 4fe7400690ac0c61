package bpf_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/xvs-lb/xvs/loader"
	"github.com/xvs-lb/xvs/maps"
	"github.com/xvs-lb/xvs/model"
	"github.com/xvs-lb/xvs/reconcile"
)

// TC actions, from linux/pkt_cls.h.
const (
	tcActOK       = 0
	tcActShot     = 2
	tcActRedirect = 7
)

// requirePrivilege fails (never skips) when the test cannot load BPF: the
// packet tests are part of CI, and a silent skip would hide a broken setup.
func requirePrivilege(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test loads BPF programs and needs root (CAP_BPF, CAP_NET_ADMIN); run it as root")
	}
}

// env is a loaded datapath with maps under a private pin path.
type env struct {
	objs    *loader.Objects
	m       *maps.Maps
	dp      *reconcile.Datapath
	pinPath string
}

var envSeq atomic.Int64

func newEnv(t testing.TB, cfg loader.Config) *env {
	t.Helper()
	return newEnvMaps(t, cfg, reconcile.Config{})
}

// newEnvMaps is newEnv with the datapath's settings (mc; its sizes come
// from cfg).
func newEnvMaps(t testing.TB, cfg loader.Config, mc reconcile.Config) *env {
	t.Helper()
	requirePrivilege(t)
	if err := loader.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	// Each env its own maps, also when a test has several.
	cfg.PinPath = filepath.Join("/sys/fs/bpf", fmt.Sprintf("xvs-test-%d-%d-%s", os.Getpid(), envSeq.Add(1), sanitize(t.Name())))
	t.Cleanup(func() { os.RemoveAll(cfg.PinPath) })
	objs, err := loader.Load(cfg)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { objs.Close() })
	m := maps.FromObjects(objs)
	mc.MaxServices, mc.MaxBackends = cfg.MaxServices, cfg.MaxBackends
	dp, err := reconcile.NewDatapath(m, mc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{objs: objs, m: m, dp: dp, pinPath: cfg.PinPath}
}

func sanitize(s string) string {
	out := []byte(s)
	for i, c := range out {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			out[i] = '_'
		}
	}
	if len(out) > 60 {
		out = out[:60]
	}
	return string(out)
}

func (e *env) sync(t testing.TB, sps ...*model.ServicePort) {
	t.Helper()
	st := &model.State{Services: map[model.ServicePortName]*model.ServicePort{}}
	for _, sp := range sps {
		st.Services[sp.Name] = sp
	}
	if err := e.dp.Sync(context.Background(), st); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

// run passes one packet through the tc program.
func (e *env) run(t testing.TB, pkt []byte) (uint32, []byte) {
	t.Helper()
	ret, out, err := e.objs.XvsTcIngress.Test(pkt)
	if err != nil {
		t.Fatalf("prog test run: %v", err)
	}
	return ret, out
}

func clusterIPService(name string, vip netip.Addr, port uint16, proto model.Protocol, backends ...netip.AddrPort) *model.ServicePort {
	sp := &model.ServicePort{
		Name:      model.ServicePortName{Namespace: "default", Name: name, Protocol: proto},
		Frontends: []model.Frontend{{Kind: model.ClusterIP, Addr: vip, Port: port, Proto: proto}},
	}
	for _, b := range backends {
		sp.ClusterEndpoints = append(sp.ClusterEndpoints, model.Endpoint{Addr: b.Addr(), Port: b.Port(), Ready: true, Serving: true, Weight: 1})
	}
	sp.HasEndpoints = len(backends) > 0
	return sp
}

var (
	clientMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	nodeMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
)

type l4 struct {
	proto      model.Protocol
	sport      uint16
	dport      uint16
	syn, ack   bool
	fin, rst   bool
	payload    []byte
	ipFlags    layers.IPv4Flag
	fragOffset uint16
	id         uint16
}

// packet builds an Ethernet/IPv4/TCP-or-UDP packet with valid checksums.
func packet(t testing.TB, src, dst netip.Addr, p l4) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: nodeMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{
		Version: 4, IHL: 5, TTL: 64, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(),
		Flags: p.ipFlags, FragOffset: p.fragOffset, Id: p.id,
	}
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	var err error
	switch p.proto {
	case model.UDP:
		ip.Protocol = layers.IPProtocolUDP
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.sport), DstPort: layers.UDPPort(p.dport)}
		udp.SetNetworkLayerForChecksum(ip)
		err = gopacket.SerializeLayers(buf, opts, eth, ip, udp, gopacket.Payload(p.payload))
	default:
		ip.Protocol = layers.IPProtocolTCP
		tcp := &layers.TCP{
			SrcPort: layers.TCPPort(p.sport), DstPort: layers.TCPPort(p.dport),
			SYN: p.syn, ACK: p.ack, FIN: p.fin, RST: p.rst, Seq: 1000, Ack: 2000, Window: 65535,
		}
		if p.ack {
			tcp.Ack = 5000
		}
		tcp.SetNetworkLayerForChecksum(ip)
		err = gopacket.SerializeLayers(buf, opts, eth, ip, tcp, gopacket.Payload(p.payload))
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// decoded is what a test checks about an output packet.
type decoded struct {
	src, dst     netip.AddrPort
	proto        layers.IPProtocol
	tcp          *layers.TCP
	icmp         *layers.ICMPv4
	ip           *layers.IPv4
	checksumsOK  bool
	checksumNote string
}

// decode parses an output packet and verifies its IP and L4 checksums by
// recomputing them from scratch.
func decode(t testing.TB, b []byte) decoded {
	t.Helper()
	pkt := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
	ipL, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if !ok {
		t.Fatalf("output is not IPv4: %v", pkt)
	}
	d := decoded{ip: ipL, proto: ipL.Protocol, checksumsOK: true}
	src, _ := netip.AddrFromSlice(ipL.SrcIP)
	dst, _ := netip.AddrFromSlice(ipL.DstIP)
	var sport, dport uint16
	if tcp, ok := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP); ok {
		d.tcp, sport, dport = tcp, uint16(tcp.SrcPort), uint16(tcp.DstPort)
	}
	if udp, ok := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
		sport, dport = uint16(udp.SrcPort), uint16(udp.DstPort)
	}
	d.icmp, _ = pkt.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
	d.src, d.dst = netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport)

	if ipChecksum(b[14:14+int(ipL.IHL)*4]) != 0 {
		d.checksumsOK, d.checksumNote = false, "bad IPv4 header checksum"
	}
	if ipL.Flags&layers.IPv4MoreFragments == 0 && ipL.FragOffset == 0 {
		l4b := b[14+int(ipL.IHL)*4 : 14+int(ipL.Length)]
		switch ipL.Protocol {
		case layers.IPProtocolTCP, layers.IPProtocolUDP:
			if ipL.Protocol == layers.IPProtocolUDP && l4b[6] == 0 && l4b[7] == 0 {
				break // no UDP checksum
			}
			if pseudoChecksum(ipL, l4b) != 0 {
				d.checksumsOK, d.checksumNote = false, "bad L4 checksum"
			}
		case layers.IPProtocolICMPv4:
			if ipChecksum(l4b) != 0 {
				d.checksumsOK, d.checksumNote = false, "bad ICMP checksum"
			}
		}
	}
	return d
}

func sum16(b []byte, s uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func ipChecksum(b []byte) uint16 { return fold(sum16(b, 0)) }

func pseudoChecksum(ip *layers.IPv4, l4b []byte) uint16 {
	s := sum16(ip.SrcIP.To4(), 0)
	s = sum16(ip.DstIP.To4(), s)
	s += uint32(ip.Protocol) + uint32(len(l4b))
	return fold(sum16(l4b, s))
}
