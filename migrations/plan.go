package migrations

import (
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Migration is one embedded migration: its version and its name (the file
// name's words, "0002_signals.up.sql" is 2 and "signals").
type Migration struct {
	Version uint
	Name    string
}

// String is the migration as the files name it: "0002_signals".
func (m Migration) String() string { return fmt.Sprintf("%04d_%s", m.Version, m.Name) }

// All returns the embedded migrations in version order.
func All() []Migration {
	entries, err := fs.Glob(files, "*.up.sql")
	if err != nil {
		panic(err) // the pattern is constant and valid
	}
	out := make([]Migration, 0, len(entries))
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e, ".up.sql"), "_")
		v, err := strconv.ParseUint(num, 10, 32)
		if !ok || err != nil {
			panic(fmt.Sprintf("migrations: file %s is not NNNN_name.up.sql", e))
		}
		out = append(out, Migration{Version: uint(v), Name: name})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// Latest is the schema version this binary is built for: the highest
// embedded migration.
func Latest() uint {
	all := All()
	return all[len(all)-1].Version
}

// downSQL returns the SQL that reverts m.
func (m Migration) downSQL() (string, error) {
	b, err := files.ReadFile(m.String() + ".down.sql")
	return string(b), err
}

// Drops lists what reverting m removes or rewrites, read from its down SQL:
// "table signals", "column sessions.acked_seq", "index fallback_events_at_idx",
// "column signals.payload converted to jsonb". A statement that drops or
// rewrites something in a form not recognised here is listed as written, so
// that nothing a step removes goes unsaid.
func (m Migration) Drops() ([]string, error) {
	sql, err := m.downSQL()
	if err != nil {
		return nil, fmt.Errorf("migrations: %s: %w", m, err)
	}
	return dropsOf(sql), nil
}

var (
	lineComment = regexp.MustCompile(`--[^\n]*`)
	spaces      = regexp.MustCompile(`\s+`)
	ifExists    = `(?:IF\s+EXISTS\s+)?`
	ident       = `("?[A-Za-z_][A-Za-z0-9_.$"]*)`
	dropObject  = regexp.MustCompile(`(?i)^DROP\s+(TABLE|INDEX|VIEW|MATERIALIZED\s+VIEW|SEQUENCE|TYPE|FUNCTION|TRIGGER|SCHEMA)\s+(?:CONCURRENTLY\s+)?` + ifExists + `(.+?)(?:\s+(?:CASCADE|RESTRICT))?$`)
	alterTable  = regexp.MustCompile(`(?i)^ALTER\s+TABLE\s+` + ifExists + `(?:ONLY\s+)?` + ident + `\s+(.+)$`)
	dropColumn  = regexp.MustCompile(`(?i)^DROP\s+(?:COLUMN\s+)?` + ifExists + ident)
	dropConstr  = regexp.MustCompile(`(?i)^DROP\s+CONSTRAINT\s+` + ifExists + ident)
	addForeign  = regexp.MustCompile(`(?i)^ADD\s+(?:CONSTRAINT\s+` + ident + `\s+)?FOREIGN\s+KEY\b`)
	alterType   = regexp.MustCompile(`(?i)^ALTER\s+(?:COLUMN\s+)?` + ident + `\s+(?:SET\s+DATA\s+)?TYPE\s+([A-Za-z0-9_]+)`)
	updateSet   = regexp.MustCompile(`(?i)^UPDATE\s+(?:ONLY\s+)?` + ident + `(?:\s+(?:AS\s+)?[A-Za-z_][A-Za-z0-9_]*)?\s+SET\s+(.+?)(?:\s+FROM\s.*|\s+WHERE\s.*)?$`)
	setNull     = regexp.MustCompile(`(?i)^` + ident + `\s*=\s*NULL$`)
	dropWord    = regexp.MustCompile(`(?i)\b(DROP|DELETE|TRUNCATE|TYPE)\b`)
	replaceFunc = regexp.MustCompile(`(?i)^CREATE\s+OR\s+REPLACE\s+FUNCTION\s+` + ident + `\s*\(`)
	dollarTag   = regexp.MustCompile(`\$[A-Za-z_]*\$`)
)

// dropsOf is Drops of one down file's text.
func dropsOf(sql string) []string {
	var out []string
	for _, stmt := range strings.Split(lineComment.ReplaceAllString(withoutBodies(sql), ""), ";") {
		stmt = strings.TrimSpace(spaces.ReplaceAllString(stmt, " "))
		if stmt == "" {
			continue
		}
		items := recognise(stmt)
		if items == nil && dropWord.MatchString(stmt) {
			items = []string{"statement: " + stmt}
		}
		out = append(out, items...)
	}
	return out
}

// withoutBodies is sql with each dollar-quoted string ($$ … $$, $tag$ …
// $tag$: a function's body) emptied, so that the statements inside a body
// are not read as the file's own.
func withoutBodies(sql string) string {
	var b strings.Builder
	for {
		open := dollarTag.FindStringIndex(sql)
		if open == nil {
			return b.String() + sql
		}
		tag := sql[open[0]:open[1]]
		end := strings.Index(sql[open[1]:], tag)
		if end < 0 {
			return b.String() + sql // unterminated: left as written
		}
		b.WriteString(sql[:open[1]])
		b.WriteString(tag)
		sql = sql[open[1]+end+len(tag):]
	}
}

// recognise names what one statement drops or rewrites, or returns nil.
func recognise(stmt string) []string {
	if m := replaceFunc.FindStringSubmatch(stmt); m != nil {
		return []string{"function " + unquote(m[1]) + " replaced by its earlier definition"}
	}
	if m := dropObject.FindStringSubmatch(stmt); m != nil {
		kind := strings.ToLower(spaces.ReplaceAllString(m[1], " "))
		var out []string
		for _, name := range strings.Split(m[2], ",") {
			out = append(out, kind+" "+unquote(strings.TrimSpace(name)))
		}
		return out
	}
	if m := updateSet.FindStringSubmatch(stmt); m != nil {
		table := unquote(m[1])
		out := []string{} // recognised, though it may clear nothing
		for _, set := range splitTopLevel(m[2]) {
			if c := setNull.FindStringSubmatch(strings.TrimSpace(set)); c != nil {
				out = append(out, "column "+table+"."+unquote(c[1])+" set to NULL in the rows it updates")
			}
		}
		return out
	}
	m := alterTable.FindStringSubmatch(stmt)
	if m == nil {
		return nil
	}
	table := unquote(m[1])
	out := []string{} // recognised, though it may drop nothing
	for _, action := range splitTopLevel(m[2]) {
		switch {
		case addForeign.MatchString(action):
			// Drops nothing; its ON DELETE names what a later delete does.
		case dropConstr.MatchString(action):
			out = append(out, "constraint "+table+"."+unquote(dropConstr.FindStringSubmatch(action)[1]))
		case dropColumn.MatchString(action):
			out = append(out, "column "+table+"."+unquote(dropColumn.FindStringSubmatch(action)[1]))
		case alterType.MatchString(action):
			a := alterType.FindStringSubmatch(action)
			out = append(out, "column "+table+"."+unquote(a[1])+" converted to "+a[2])
		case dropWord.MatchString(action):
			out = append(out, "statement: ALTER TABLE "+table+" "+action)
		}
	}
	return out
}

// splitTopLevel splits an ALTER TABLE's actions on the commas outside
// parentheses.
func splitTopLevel(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

func unquote(name string) string { return strings.ReplaceAll(name, `"`, "") }
