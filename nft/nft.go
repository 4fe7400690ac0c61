// Package nft applies nftables scripts with the nft binary, the way both
// datapaths keep their own tables: each script replaces a table whole, in
// one transaction.
package nft

import (
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
