package marconi_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

var (
	fence   = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
	heading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*$`)
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
)

// anchors are the ids GitHub gives the headings of a Markdown text: lower
// case, spaces to hyphens, punctuation dropped, a repeat numbered.
func anchors(text string) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
		id := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return unicode.ToLower(r)
			}
			return -1
		}, m[1])
		if n := seen[id]; n > 0 {
			seen[id]++
			id = fmt.Sprintf("%s-%d", id, n)
		} else {
			seen[id] = 1
		}
		ids[id] = true
	}
	return ids
}

// TestDocsLinksResolve: every relative link of the README and docs/ names a
// file of the repository and, with a #fragment into a Markdown page, one of
// its headings, so that a reader following one lands where it says.
func TestDocsLinksResolve(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "README.md")
	links := 0
	for _, page := range pages {
		text := fence.ReplaceAllString(read(t, page), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			path, fragment, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Join(filepath.Dir(page), path)
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s links to %s: no such file", page, target)
				continue
			}
			if fragment != "" && strings.HasSuffix(file, ".md") && !anchors(read(t, file))[fragment] {
				t.Errorf("%s links to %s: %s has no heading #%s", page, target, file, fragment)
			}
		}
	}
	if links < 50 {
		t.Fatalf("found %d relative links: the parse is broken", links)
	}
}

// TestNodeConfigDefaultsAreDocumented holds docs/client.md's Node Config
// table to the defaults of clients/node/src/config.js: each default is in the
// row that names its field.
func TestNodeConfigDefaultsAreDocumented(t *testing.T) {
	const config = "clients/node/src/config.js"
	defaults := regexp.MustCompile(`(?m)^  (\w+): (\d+),$`).FindAllStringSubmatch(
		block(t, read(t, config), config, "export const defaults = Object.freeze({", "});"), -1)
	if len(defaults) < 10 {
		t.Fatalf("found %d defaults in %s: the parse is broken", len(defaults), config)
	}
	doc := read(t, "docs/client.md")
	table := block(t, doc, "docs/client.md", "## Config (Node)", "\n`client.send(")
	for _, d := range defaults {
		row := regexp.MustCompile("(?m)^\\|[^|]*`" + d[1] + "`[^|]*\\|.*$").FindString(table)
		if row == "" {
			t.Errorf("docs/client.md, Config (Node), has no row for %s", d[1])
			continue
		}
		if !strings.Contains(row, "**"+d[2]+"**") {
			t.Errorf("docs/client.md, Config (Node), does not give %s its default **%s**: %s", d[1], d[2], row)
		}
	}
}
