package marconi_test

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/marconihub/marconi"
)

// The Node client's declarations and its codes, read as text: the test holds
// them to the Go words so that the two clients cannot drift apart.
const (
	nodeTypes = "clients/node/index.d.ts"
	nodeCodes = "clients/node/src/codes.js"
)

// nodeOnlyCode is the Node client's own code for an answer without the
// hub's error body; the hub never sends it.
const nodeOnlyCode = "unexpected_response"

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// block returns the text between start and the first end after it.
func block(t *testing.T, src, file, start, end string) string {
	t.Helper()
	i := strings.Index(src, start)
	if i < 0 {
		t.Fatalf("%s: no %q", file, start)
	}
	rest := src[i+len(start):]
	j := strings.Index(rest, end)
	if j < 0 {
		t.Fatalf("%s: %q has no end %q", file, start, end)
	}
	return rest[:j]
}

var (
	quoted    = regexp.MustCompile(`'([^']*)'`)
	fourDigit = regexp.MustCompile(`\b\d{4}\b`)
)

var lineComment = regexp.MustCompile(`//.*`)

// words returns the quoted strings of text outside its line comments, sorted.
func words(text string) []string {
	var out []string
	for _, m := range quoted.FindAllStringSubmatch(lineComment.ReplaceAllString(text, ""), -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return out
}

// numbers returns the four-digit numbers of text, sorted.
func numbers(t *testing.T, text string) []int {
	var out []int
	for _, m := range fourDigit.FindAllString(text, -1) {
		n, err := strconv.Atoi(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// sorted returns the Go words as sorted strings, with extra added.
func sorted[T ~string](ws []T, extra ...string) []string {
	out := extra
	for _, w := range ws {
		out = append(out, string(w))
	}
	slices.Sort(out)
	return out
}

func same[E comparable](t *testing.T, what string, got, want []E) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s = %v, want the Go vocabulary's %v", what, got, want)
	}
}

func TestNodeTypesSpellTheGoVocabulary(t *testing.T) {
	d := read(t, nodeTypes)
	union := func(name string) string { return block(t, d, nodeTypes, "export type "+name+" =", ";") }

	same(t, "ErrorCode", words(union("ErrorCode")), sorted(marconi.Codes, nodeOnlyCode))
	same(t, "Delivery", words(union("Delivery")), sorted(marconi.Deliveries))
	same(t, "RouteState", words(union("RouteState")), sorted(marconi.RouteStates))
	same(t, "SelfhealOutcome", words(union("SelfhealOutcome")), sorted(marconi.Outcomes))
	same(t, "RuntimeMode", words(union("RuntimeMode")), sorted(marconi.RuntimeModes, ""))

	surface := union("Surface")
	same(t, "Surface", words(surface), sorted(marconi.Surfaces))
	if console := "`" + marconi.SurfaceConsolePrefix + "${string}`"; !strings.Contains(surface, console) {
		t.Errorf("Surface = %s, want it to hold %s", surface, console)
	}

	var closeCodes []int
	for _, c := range marconi.CloseCodes {
		closeCodes = append(closeCodes, int(c))
	}
	slices.Sort(closeCodes)
	same(t, "CloseCode", numbers(t, union("CloseCode")), closeCodes)
	same(t, "declare const closeCodes", numbers(t, block(t, d, nodeTypes, "export declare const closeCodes", "}>;")), closeCodes)
	same(t, "declare const codes", words(block(t, d, nodeTypes, "export declare const codes", "}>;")), sorted(marconi.Codes, nodeOnlyCode))
}

func TestNodeCodesSpellTheGoVocabulary(t *testing.T) {
	js := read(t, nodeCodes)
	same(t, "codes", words(block(t, js, nodeCodes, "export const codes = Object.freeze({", "});")), sorted(marconi.Codes, nodeOnlyCode))

	var closeCodes []int
	for _, c := range marconi.CloseCodes {
		closeCodes = append(closeCodes, int(c))
	}
	slices.Sort(closeCodes)
	same(t, "closeCodes", numbers(t, block(t, js, nodeCodes, "export const closeCodes = Object.freeze({", "});")), closeCodes)
}

// TestVocabularyListsAreWhole checks that each list names every word once,
// so that the checks above, which compare against the lists, see them all.
func TestVocabularyListsAreWhole(t *testing.T) {
	unique := func(what string, ws []string) {
		t.Helper()
		seen := map[string]bool{}
		for _, w := range ws {
			if seen[w] {
				t.Errorf("%s lists %q twice", what, w)
			}
			seen[w] = true
		}
	}
	unique("Codes", sorted(marconi.Codes))
	unique("Outcomes", sorted(marconi.Outcomes))
	unique("RouteStates", sorted(marconi.RouteStates))
	unique("Deliveries", sorted(marconi.Deliveries))
	unique("Surfaces", sorted(marconi.Surfaces))
	for _, s := range marconi.Surfaces {
		if !s.Valid() {
			t.Errorf("Surfaces lists %q, which Valid refuses", s)
		}
	}
	declared := regexp.MustCompile(`(?m)^\tCode\w+\s+Code = "([^"]+)"`).FindAllStringSubmatch(read(t, "errors.go"), -1)
	var consts []string
	for _, m := range declared {
		consts = append(consts, m[1])
	}
	slices.Sort(consts)
	same(t, "the Code constants of errors.go", consts, sorted(marconi.Codes))
	api := read(t, "docs/api.md")
	for _, c := range marconi.Codes {
		if !regexp.MustCompile(`\b` + string(c) + `\b`).MatchString(api) {
			t.Errorf("docs/api.md never names the code %q", c)
		}
	}
}

func TestProjectRoute(t *testing.T) {
	for _, c := range []struct{ tenant, project, want string }{
		{"t1", "p1", "t1/p1"},
		{"acme.corp", "team_a-1", "acme.corp/team_a-1"},
		{"", "p1", ""},
		{"t1", "", ""},
		{"t/1", "p1", ""},
		{"t1", "p 1", ""},
		{"t1", "p1\r\nX-Admin: yes", ""},
		{"t1", strings.Repeat("p", 129), ""},
		{strings.Repeat("t", 128), "p", strings.Repeat("t", 128) + "/p"},
	} {
		if got := marconi.ProjectRoute(c.tenant, c.project); got != c.want {
			t.Errorf("ProjectRoute(%q, %q) = %q, want %q", c.tenant, c.project, got, c.want)
		}
	}
}

// TestNodeProjectHeaderIsGos: both clients name the project in one header.
func TestNodeProjectHeaderIsGos(t *testing.T) {
	js := read(t, nodeCodes)
	want := "export const projectHeader = '" + strings.ToLower(marconi.HeaderProject) + "';"
	if !strings.Contains(js, want) {
		t.Errorf("%s does not say %s", nodeCodes, want)
	}
}
