package main

import (
	"bytes"
	"encoding/json"
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

// TestMCPHostSnippetsStartTheServer holds the host configurations of
// docs/mcp.md and the README to `marconi mcp`: each one's command is
// marconi, its arguments are `mcp` and flags the server takes, its variables
// are the server's, and together they make a configuration the server
// accepts (${VAR} references given values, as the host would).
func TestMCPHostSnippetsStartTheServer(t *testing.T) {
	var snippets []mcpSnippet
	for _, file := range []string{filepath.Join("docs", "mcp.md"), "README.md"} {
		doc, err := os.ReadFile(filepath.Join("..", "..", file))
		if err != nil {
			t.Fatal(err)
		}
		snippets = append(snippets, mcpSnippets(t, file, string(doc))...)
	}
	if len(snippets) < 5 { // Claude Code twice, its .mcp.json, Codex, Cursor
		t.Fatalf("found %d host configurations in docs/mcp.md and README.md, want 5: %+v", len(snippets), snippets)
	}
	settings := map[string]bool{}
	for _, s := range mcpSettings {
		settings[s.env] = true
	}
	for _, sn := range snippets {
		if sn.command != "marconi" || len(sn.args) == 0 || sn.args[0] != "mcp" {
			t.Errorf("%s: runs %s %q, want marconi mcp", sn.where, sn.command, sn.args)
			continue
		}
		env := map[string]string{"HOME": "/home/agent"}
		for k := range sn.env {
			if !settings[k] {
				t.Errorf("%s: sets %s, which marconi mcp does not read", sn.where, k)
			}
			env[k] = "from-the-host"
		}
		c := cli{getenv: func(k string) string { return env[k] }, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
		if _, err := c.loadMCPConfig(sn.args[1:]); err != nil {
			t.Errorf("%s: marconi %q with %v: %v", sn.where, sn.args, sn.env, err)
		}
	}
}

// mcpSnippet is one host's configuration of the server.
type mcpSnippet struct {
	where   string
	command string
	args    []string
	// toolTimeout is a Codex table's tool_timeout_sec (0: not set).
	toolTimeout int
	env         map[string]string
}

// mcpSnippets finds the host configurations in doc: `claude mcp add`
// commands, Codex's [mcp_servers.*] tables and mcpServers JSON files.
func mcpSnippets(t *testing.T, file, doc string) []mcpSnippet {
	t.Helper()
	var out []mcpSnippet
	for _, m := range regexp.MustCompile(`(?m)^claude mcp add ((?:\\\n|[^\n])*)`).FindAllStringSubmatch(doc, -1) {
		fields := strings.Fields(strings.ReplaceAll(m[1], "\\\n", " "))
		sn := mcpSnippet{where: file + ": claude mcp add", env: map[string]string{}}
		for i := 0; i < len(fields); i++ {
			switch {
			case fields[i] == "--env" && i+1 < len(fields):
				k, v, _ := strings.Cut(fields[i+1], "=")
				sn.env[k] = v
				i++
			case fields[i] == "--":
				if i+1 < len(fields) {
					sn.command, sn.args = fields[i+1], fields[i+2:]
				}
				i = len(fields)
			}
		}
		out = append(out, sn)
	}
	for _, m := range regexp.MustCompile("(?s)```toml\n(\\[mcp_servers\\.[^\n]*)\n(.*?)```").FindAllStringSubmatch(doc, -1) {
		sn := mcpSnippet{where: file + ": " + m[1], env: map[string]string{}}
		for _, line := range strings.Split(m[2], "\n") {
			k, v, ok := strings.Cut(line, " = ")
			if !ok {
				continue
			}
			switch k { // the values used here are JSON as well as TOML
			case "command":
				_ = json.Unmarshal([]byte(v), &sn.command)
			case "args":
				if err := json.Unmarshal([]byte(v), &sn.args); err != nil {
					t.Errorf("%s: args %s: %v", sn.where, v, err)
				}
			case "env":
				for _, kv := range regexp.MustCompile(`(\w+) = "[^"]*"`).FindAllStringSubmatch(v, -1) {
					sn.env[kv[1]] = ""
				}
			case "tool_timeout_sec":
				sn.toolTimeout, _ = strconv.Atoi(v)
			}
		}
		// Codex gives up on a tool after tool_timeout_sec (60 by default);
		// an answer that ends read_signals's longest wait (60 s, the
		// contract's) must reach it before then, or the signals the
		// bridge acknowledged with it are never seen.
		if sn.toolTimeout <= 60 {
			t.Errorf("%s: tool_timeout_sec %d, want more than read_signals's longest wait, 60 s", sn.where, sn.toolTimeout)
		}
		out = append(out, sn)
	}
	for _, m := range regexp.MustCompile("(?s)```json\n(\\{\n  \"mcpServers\".*?)```").FindAllStringSubmatch(doc, -1) {
		var f struct {
			MCPServers map[string]struct {
				Command string            `json:"command"`
				Args    []string          `json:"args"`
				Env     map[string]string `json:"env"`
			} `json:"mcpServers"`
		}
		if err := json.Unmarshal([]byte(m[1]), &f); err != nil {
			t.Errorf("%s: an mcpServers file that is not JSON: %v\n%s", file, err, m[1])
			continue
		}
		for name, s := range f.MCPServers {
			out = append(out, mcpSnippet{where: file + ": mcpServers." + name, command: s.Command, args: s.Args, env: s.Env})
		}
	}
	return out
}
