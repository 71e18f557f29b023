package main

import (
	"os"
	"strings"
	"testing"
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
