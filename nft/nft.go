// Package nft applies nftables scripts with the nft binary, the way both
// datapaths keep their own tables: each script replaces a table whole, in
// one transaction.
package nft

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// Families are the table families xvs writes: one table per family.
var Families = []string{"ip", "ip6"}

// Run applies script (nft -f -) in the calling thread's network namespace.
func Run(script string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if errors.Is(err, exec.ErrNotFound) {
		return fmt.Errorf("the nft binary (nftables) is needed: %w", err)
	}
	if err != nil {
		return fmt.Errorf("nft: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DeleteTable writes to w the lines that delete table name of family fam,
// succeeding when it is absent (it is declared first); a script that
// replaces the table follows them with its new content.
func DeleteTable(w io.Writer, fam, name string) {
	fmt.Fprintf(w, "table %s %s\ndelete table %s %s\n", fam, name, fam, name)
}

// DeleteTables deletes table name in every family; absent tables are fine.
func DeleteTables(name string) error {
	var b strings.Builder
	for _, fam := range Families {
		DeleteTable(&b, fam, name)
	}
	return Run(b.String())
}

// ErrNoSuchSet: the table or the set does not exist.
var ErrNoSuchSet = errors.New("no such nftables set")

// SetElements lists the elements of set name of table fam/table, each as
// its components in order (one for a plain set, one per field of a
// concatenation), written as nft writes them: an address, a protocol
// name, a port number, a prefix "addr/len", a range "first-last".
func SetElements(fam, table, name string) ([][]string, error) {
	cmd := exec.Command("nft", "-j", "list", "set", fam, table, name)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if errors.Is(err, exec.ErrNotFound) {
		return nil, fmt.Errorf("the nft binary (nftables) is needed: %w", err)
	}
	if err != nil {
		if strings.Contains(stderr.String(), "No such file or directory") {
			return nil, fmt.Errorf("%s %s %s: %w", fam, table, name, ErrNoSuchSet)
		}
		return nil, fmt.Errorf("nft list set %s %s %s: %w: %s", fam, table, name, err, strings.TrimSpace(stderr.String()))
	}
	return parseSetElements(out)
}

func parseSetElements(out []byte) ([][]string, error) {
	var doc struct {
		Nftables []struct {
			Set *struct {
				Elem []json.RawMessage `json:"elem"`
			} `json:"set"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("nft -j: %w", err)
	}
	var elems [][]string
	for _, o := range doc.Nftables {
		if o.Set == nil {
			continue
		}
		for _, raw := range o.Set.Elem {
			var c struct {
				Concat []json.RawMessage `json:"concat"`
			}
			parts := []json.RawMessage{raw}
			if json.Unmarshal(raw, &c) == nil && c.Concat != nil {
				parts = c.Concat
			}
			elem := make([]string, 0, len(parts))
			for _, p := range parts {
				v, err := setValue(p)
				if err != nil {
					return nil, err
				}
				elem = append(elem, v)
			}
			elems = append(elems, elem)
		}
	}
	return elems, nil
}

// setValue writes one component: a string or number as it is, a prefix
// as "addr/len", a range as "first-last"; an element with a timeout or a
// comment ({"elem": {"val": ...}}) as its value.
func setValue(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String(), nil
	}
	var o struct {
		Prefix *struct {
			Addr string `json:"addr"`
			Len  int    `json:"len"`
		} `json:"prefix"`
		Range []json.RawMessage `json:"range"`
		Elem  *struct {
			Val json.RawMessage `json:"val"`
		} `json:"elem"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("nft -j: element %s: %w", raw, err)
	}
	switch {
	case o.Prefix != nil:
		return fmt.Sprintf("%s/%d", o.Prefix.Addr, o.Prefix.Len), nil
	case len(o.Range) == 2:
		a, err := setValue(o.Range[0])
		if err != nil {
			return "", err
		}
		b, err := setValue(o.Range[1])
		return a + "-" + b, err
	case o.Elem != nil:
		return setValue(o.Elem.Val)
	}
	return "", fmt.Errorf("nft -j: element %s: unknown form", raw)
}

// ListChain returns nft's text of chain name of table fam/table.
func ListChain(fam, table, name string) (string, error) {
	out, err := exec.Command("nft", "list", "chain", fam, table, name).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("nft list chain %s %s %s: %w: %s", fam, table, name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
