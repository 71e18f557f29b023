// Package fieldcheck names the fields of a Config that fail their checks,
// the one shape of "fields must be …" errors the packages' validate steps
// share (hub, hub/conns).
package fieldcheck

import (
	"fmt"
	"slices"
	"strings"
)

// Check returns nil when every check in ok holds, else an error
// "<pkg>: Config fields must be <want>: A, B" naming, in order, each field
// whose check is false.
func Check(pkg, want string, ok map[string]bool) error {
	var bad []string
	for name, good := range ok {
		if !good {
			bad = append(bad, name)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	slices.Sort(bad)
	return fmt.Errorf("%s: Config fields must be %s: %s", pkg, want, strings.Join(bad, ", "))
}
