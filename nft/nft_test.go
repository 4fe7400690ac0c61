package nft

import (
	"slices"
	"testing"
)

// TestParseSetElements: nft -j's forms of set elements (nftables 1.0.6,
// Debian bookworm's): concatenations, prefixes and plain values in an
// interval set, ranges, and elements with a timeout.
func TestParseSetElements(t *testing.T) {
	for _, c := range []struct {
		name, json string
		want       [][]string
	}{
		{"concatenation", `{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"set": {"family": "ip", "name": "services", "table": "t", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 1, "elem": [{"concat": ["10.0.0.2", "udp", 53]}, {"concat": ["10.0.0.1", "tcp", 80]}]}}]}`,
			[][]string{{"10.0.0.2", "udp", "53"}, {"10.0.0.1", "tcp", "80"}}},
		{"interval", `{"nftables": [{"set": {"family": "ip", "name": "pods", "table": "t", "type": "ipv4_addr", "flags": ["interval"], "elem": ["10.1.2.3", {"prefix": {"addr": "10.244.0.0", "len": 16}}, {"range": ["10.9.0.1", "10.9.0.7"]}]}}]}`,
			[][]string{{"10.1.2.3"}, {"10.244.0.0/16"}, {"10.9.0.1-10.9.0.7"}}},
		{"concatenated interval", `{"nftables": [{"set": {"name": "lb_allow", "elem": [{"concat": ["1.2.3.4", "tcp", 80, {"prefix": {"addr": "192.0.2.0", "len": 24}}]}, {"concat": ["1.2.3.4", "tcp", 80, "1.2.3.4"]}]}}]}`,
			[][]string{{"1.2.3.4", "tcp", "80", "192.0.2.0/24"}, {"1.2.3.4", "tcp", "80", "1.2.3.4"}}},
		{"timeout", `{"nftables": [{"set": {"name": "s", "elem": [{"elem": {"val": "fd00::1", "timeout": 30}}]}}]}`,
			[][]string{{"fd00::1"}}},
		{"empty", `{"nftables": [{"set": {"name": "vips", "type": "ipv4_addr"}}]}`, nil},
	} {
		got, err := parseSetElements([]byte(c.json))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !slices.EqualFunc(got, c.want, slices.Equal[[]string]) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if _, err := parseSetElements([]byte(`{"nftables": [{"set": {"elem": [{"set": 1}]}}]}`)); err == nil {
		t.Error("an element of an unknown form was accepted")
	}
}
