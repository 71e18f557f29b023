package bootstrap_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestOutsideModuleRecipe builds, in a temporary directory outside this
// repository, the Go program docs/client.md shows ("Depending on the client
// from your own module"), with the recipe's shell lines exactly as the docs
// give them: a module of its own whose replace directive points at this
// checkout. Modules come from GOPROXY or the module cache as the environment
// has them; when none can be reached the test skips, saying so.
func TestOutsideModuleRecipe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module outside the repository: not with -short")
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(repo, "docs", "client.md"))
	if err != nil {
		t.Fatal(err)
	}
	recipe := fencedAfter(t, string(doc), "<!-- go-outside-recipe")
	mainGo := fencedAfter(t, string(doc), "<!-- go-outside-main -->")

	dir := t.TempDir()
	env := append(os.Environ(), "MARCONI="+repo, "GOFLAGS=-mod=mod", "GOWORK=off")
	wroteMain := false
	sc := bufio.NewScanner(strings.NewReader(recipe))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "# write main.go") {
			if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(mainGo), 0o644); err != nil {
				t.Fatal(err)
			}
			wroteMain = true
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cmd := exec.CommandContext(t.Context(), "sh", "-c", line)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			if unreachableModules.Match(out) && os.Getenv("MARCONI_TEST_REQUIRE_MODULES") == "" {
				t.Skipf("the recipe needs modules this machine cannot fetch (GOPROXY %q): %s: %s", os.Getenv("GOPROXY"), line, out)
			}
			t.Fatalf("recipe line %q: %v\n%s", line, err, out)
		}
	}
	if !wroteMain {
		t.Fatal("the recipe in docs/client.md no longer says where main.go is written")
	}
	if _, err := os.Stat(filepath.Join(dir, "myagent")); err != nil {
		t.Fatalf("the recipe built no program: %v", err)
	}
	gomod, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
	if !strings.Contains(string(gomod), "github.com/marconihub/marconi => "+repo) {
		t.Errorf("go.mod of the outside module does not replace the module path with the checkout:\n%s", gomod)
	}
}

// unreachableModules matches what the go command says when it cannot fetch
// a module: no network, or a proxy turned off.
var unreachableModules = regexp.MustCompile(`dial tcp|no such host|proxyconnect|GOPROXY=off|module lookup disabled|connection refused|i/o timeout|network is unreachable`)

// fencedAfter returns the body of the first fenced code block after marker in doc.
func fencedAfter(t *testing.T, doc, marker string) string {
	t.Helper()
	i := strings.Index(doc, marker)
	if i < 0 {
		t.Fatalf("docs/client.md has no %q", marker)
	}
	m := regexp.MustCompile("(?s)```[a-z]*\n(.*?)```").FindStringSubmatch(doc[i:])
	if m == nil {
		t.Fatalf("docs/client.md has no code block after %q", marker)
	}
	return m[1]
}
