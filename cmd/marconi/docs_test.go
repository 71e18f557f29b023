package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/marconihub/marconi/mcpbridge"
)

// TestEverySettingIsDocumented keeps docs/operations.md true to the code.
func TestEverySettingIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	for _, s := range settings(&c) {
		row := "| `" + s.env + "` |"
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/operations.md has no row for %s", s.env)
			continue
		}
		if s.def != "" && !strings.Contains(string(doc), row+" `"+s.def+"` |") {
			t.Errorf("docs/operations.md does not give %s its default `%s`", s.env, s.def)
		}
	}
}

// TestEveryCommandIsDocumented keeps docs/operations.md's table of commands
// whole: each command `marconi -h` lists has its row.
func TestEveryCommandIsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range commands {
		row := "| `marconi " + c.name
		if c.name == "serve" {
			row = "| `marconi [serve]"
		}
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/operations.md, Running, has no row for marconi %s", c.name)
		}
	}
}

// TestEveryMetricIsDocumented holds docs/operations.md's table of metrics to
// the code: each metric the hub's packages name (a "marconi_…" string
// literal outside the tests and the benchmark tool, which only reads them)
// has its row, and each row names such a metric. A scrape would miss the
// labelled metrics nothing has counted yet, and those of Postgres or NATS.
func TestEveryMetricIsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(marconi_[a-z0-9_]+)` \\|").FindAllSubmatch(doc, -1) {
		documented[string(m[1])] = true
	}
	literal := regexp.MustCompile(`"(marconi_[a-z0-9_]+)"`)
	defined := map[string]string{}
	root := filepath.Join("..", "..")
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata" || name == "marconi-bench") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range literal.FindAllSubmatch(src, -1) {
			defined[string(m[1])] = path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defined) < 30 || len(documented) < 30 {
		t.Fatalf("found %d metrics in the code and %d rows in docs/operations.md: the parse is broken", len(defined), len(documented))
	}
	for name, path := range defined {
		if !documented[name] {
			t.Errorf("%s (%s) has no row in docs/operations.md, Metrics", name, path)
		}
	}
	for name := range documented {
		if defined[name] == "" {
			t.Errorf("docs/operations.md, Metrics, has a row for %s, which no code defines", name)
		}
	}
}

// TestEveryMCPSettingIsDocumented holds docs/mcp.md's configuration table to
// the flags of `marconi mcp`: each flag has its row with its variable, each
// row is a flag, and the defaults the table gives are the bridge's.
func TestEveryMCPSettingIsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "mcp.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{} // flag → the rest of its row
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z-]+)` \\| (.*)$").FindAllSubmatch(doc, -1) {
		rows[string(m[1])] = string(m[2])
	}
	var flags []string
	for _, s := range mcpSettings {
		flags = append(flags, s.flag)
		row, ok := rows[s.flag]
		if !ok {
			t.Errorf("docs/mcp.md has no row for --%s", s.flag)
			continue
		}
		if !strings.HasPrefix(row, "`"+s.env+"` |") {
			t.Errorf("docs/mcp.md gives --%s another variable than %s: %s", s.flag, s.env, row)
		}
	}
	for flag := range rows {
		if !slices.Contains(flags, flag) {
			t.Errorf("docs/mcp.md has a row for --%s, which marconi mcp does not take", flag)
		}
	}
	for flag, def := range map[string]string{"surface": "`" + mcpbridge.DefaultSurface + "`", "inbox-size": strconv.Itoa(mcpbridge.DefaultInboxSize)} {
		if !strings.Contains(rows[flag], "| "+def+" |") {
			t.Errorf("docs/mcp.md does not give --%s its default %s: %s", flag, def, rows[flag])
		}
	}
}
