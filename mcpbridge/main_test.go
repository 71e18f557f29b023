package mcpbridge_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// marconiBin is the marconi binary built from this tree, which the tests run
// as `marconi mcp` (and, for the restart test, `marconi serve`).
var marconiBin string

// TestMain builds the binary once, runs the tests, and checks that no
// goroutine of the tests (MCP clients, hubs, proxies) is left behind.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "marconi-mcp-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	marconiBin = filepath.Join(dir, "marconi")
	if out, err := exec.Command("go", "build", "-o", marconiBin, "../cmd/marconi").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ../cmd/marconi: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}
