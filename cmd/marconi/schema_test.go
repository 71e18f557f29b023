package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/migrations"
)

// TestReadyzFailsOnASchemaNotTheBinarys: a hub whose schema is stepped back
// under it, moved ahead of it, or left dirty is not ready; /readyz names the
// class to anyone and the versions to the admin token, and is ready again
// once the schema is right.
func TestReadyzFailsOnASchemaNotTheBinarys(t *testing.T) {
	dbURL := pgtest.Schema(t)
	latest := migrations.Latest()
	m, out := startMain(t, map[string]string{"MARCONI_DATABASE_URL": dbURL, "MARCONI_INSTANCE_HEARTBEAT_SECONDS": "1"})
	admin := adminToken(t, out.String())
	pollUntil(t, "the hub to be ready", func() bool { return get(t, m.URL()+"/readyz") == 200 })
	kv := map[string]string{"MARCONI_DATABASE_URL": dbURL}

	// The hub checks the schema once per instance heartbeat, off the request path.
	expect := func(class, detail string) {
		t.Helper()
		var st int
		var body string
		pollUntil(t, "readyz to name "+class, func() bool {
			st, body = readyz(t, m.URL(), "")
			return strings.Contains(body, class)
		})
		if st != 503 || !strings.Contains(body, `"registry_unavailable"`) || !strings.Contains(body, "("+class+")") || strings.Contains(body, "version") {
			t.Errorf("public readyz: %d %s; want the class %q without versions", st, body, class)
		}
		if st, body := readyz(t, m.URL(), admin); st != 503 || !strings.Contains(body, detail) {
			t.Errorf("admin readyz: %d %s; want %q", st, body, detail)
		}
	}
	if code, _, stderr := runCLI(t, kv, "", false, "migrate", "down", "--yes", "--force"); code != 0 {
		t.Fatalf("migrate down: exit %d %s", code, stderr)
	}
	all := migrations.All() // the version before the latest (a number may be skipped)
	expect("schema behind this binary", fmt.Sprintf("schema at version %d, this binary needs %d", all[len(all)-2].Version, latest))
	// Calls on a schema that lacks what the binary uses answer 503, not 500.
	key := devKey(t, out.String())
	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"alice","surface":"claude_code"}`); a.status != 503 || a.code != "registry_unavailable" {
		t.Errorf("register on a schema behind the binary: %+v, want 503 registry_unavailable", a)
	}
	if code, _, stderr := runCLI(t, kv, "", false, "migrate", "up"); code != 0 {
		t.Fatalf("migrate up: exit %d %s", code, stderr)
	}
	pollUntil(t, "readyz after migrate up", func() bool { st, _ := readyz(t, m.URL(), ""); return st == 200 })

	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	set := func(version uint, dirty bool) {
		t.Helper()
		if _, err := conn.Exec(t.Context(), `UPDATE schema_migrations SET version = $1, dirty = $2`, int64(version), dirty); err != nil {
			t.Fatal(err)
		}
	}
	set(latest+1, false) // a newer binary migrated it
	expect("schema ahead of this binary", fmt.Sprintf("schema at version %d, this binary knows up to %d", latest+1, latest))
	// Its calls still work: a newer schema keeps what this binary uses.
	if a := post(t, m.URL()+"/v1/sessions", key, `{"session_id":"bob","surface":"claude_code"}`); a.status != 201 {
		t.Errorf("register on a schema ahead of the binary: %+v, want 201", a)
	}
	set(latest, true) // a migration failed halfway
	expect("schema dirty", fmt.Sprintf("schema dirty at version %d", latest))
	set(latest, false)
	pollUntil(t, "readyz with the schema put right", func() bool { st, _ := readyz(t, m.URL(), ""); return st == 200 })
}

// TestStartOnASchemaNoMigrationFixes: a hub started on a schema a newer
// binary migrated, or one left dirty, is not ready and says why in its
// banner and /readyz, not just "migrations failing".
func TestStartOnASchemaNoMigrationFixes(t *testing.T) {
	latest := migrations.Latest()
	for _, tt := range []struct {
		name          string
		version       uint
		dirty         bool
		class, detail string
	}{
		{"ahead", latest + 1, false, "schema ahead of this binary", fmt.Sprintf("schema at version %d, this binary knows up to %d", latest+1, latest)},
		{"dirty", latest, true, "schema dirty", fmt.Sprintf("schema dirty at version %d", latest)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dbURL := pgtest.Schema(t)
			conn, err := pgx.Connect(t.Context(), dbURL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(t.Context())
			if _, err := conn.Exec(t.Context(), `UPDATE schema_migrations SET version = $1, dirty = $2`, int64(tt.version), tt.dirty); err != nil {
				t.Fatal(err)
			}
			m, out := startMain(t, map[string]string{"MARCONI_DATABASE_URL": dbURL})
			if !strings.Contains(out.String(), "NOT READY: "+tt.detail) {
				t.Errorf("banner does not name the schema:\n%s", out.String())
			}
			if st, body := readyz(t, m.URL(), ""); st != 503 || !strings.Contains(body, "("+tt.class+")") {
				t.Errorf("public readyz: %d %s", st, body)
			}
			if st, body := readyz(t, m.URL(), adminToken(t, out.String())); st != 503 || !strings.Contains(body, tt.detail) {
				t.Errorf("admin readyz: %d %s", st, body)
			}
		})
	}
}
