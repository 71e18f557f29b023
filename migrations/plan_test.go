package migrations

import (
	"reflect"
	"strings"
	"testing"
)

func TestDropsOfDownSQL(t *testing.T) {
	tests := []struct {
		sql  string
		want []string
	}{
		{"DROP TABLE IF EXISTS api_keys;\nDROP TABLE sessions;", []string{"table api_keys", "table sessions"}},
		{"DROP TABLE a, b CASCADE;", []string{"table a", "table b"}},
		{"-- a comment that says DROP TABLE nothing\nDROP INDEX CONCURRENTLY IF EXISTS signals_pending_idx;", []string{"index signals_pending_idx"}},
		{"ALTER TABLE sessions DROP COLUMN acked_seq, DROP COLUMN IF EXISTS pending_bytes, DROP queue_latest_attach;",
			[]string{"column sessions.acked_seq", "column sessions.pending_bytes", "column sessions.queue_latest_attach"}},
		{"ALTER TABLE signals ALTER COLUMN payload TYPE jsonb USING payload::jsonb;", []string{"column signals.payload converted to jsonb"}},
		{"ALTER TABLE ONLY \"sessions\" DROP CONSTRAINT sessions_key_uniq, ADD COLUMN x int;", []string{"constraint sessions.sessions_key_uniq"}},
		{"DELETE FROM signals WHERE acked;", []string{"statement: DELETE FROM signals WHERE acked"}},
		{"CREATE INDEX x ON t (a);", nil},
		{"ALTER TABLE signals ADD CONSTRAINT fk FOREIGN KEY (a) REFERENCES sessions (a) ON DELETE CASCADE;", nil},
		{"DROP TRIGGER sessions_delete_signals ON sessions;", []string{"trigger sessions_delete_signals ON sessions"}},
		{"UPDATE signals g SET acked_at = now(), payload = NULL FROM sessions e WHERE g.seq <= e.acked_seq;",
			[]string{"column signals.payload set to NULL in the rows it updates"}},
		{"UPDATE project_usage u SET pending_bytes = u.pending_bytes - l.bytes FROM l WHERE true;", nil},
		{"CREATE OR REPLACE FUNCTION f(a text[]) RETURNS void LANGUAGE plpgsql AS $$\nBEGIN\n  DELETE FROM t;\nEND\n$$;\n" +
			"CREATE OR REPLACE FUNCTION g() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$;\nDROP TABLE x;",
			[]string{"function f replaced by its earlier definition", "function g replaced by its earlier definition", "table x"}},
		{"CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$ BEGIN DROP TABLE t; END $$;", nil},
	}
	for _, tt := range tests {
		if got := dropsOf(tt.sql); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("dropsOf(%q) = %q, want %q", tt.sql, got, tt.want)
		}
	}
}

// TestEveryDownStepSaysWhatItDrops: each embedded migration's down step is
// read into a list an operator can check, and none falls back to quoting a
// statement it did not recognise.
func TestEveryDownStepSaysWhatItDrops(t *testing.T) {
	all := All()
	if len(all) == 0 || all[0].Version != 1 || Latest() != all[len(all)-1].Version {
		t.Fatalf("embedded migrations: %v, latest %d", all, Latest())
	}
	for _, m := range all {
		drops, err := m.Drops()
		if err != nil {
			t.Fatal(err)
		}
		if len(drops) == 0 {
			t.Errorf("%s: its down step lists nothing dropped", m)
		}
		for _, d := range drops {
			if strings.HasPrefix(d, "statement: ") {
				t.Errorf("%s: unrecognised %s", m, d)
			}
		}
	}
	sig, _ := Migration{Version: 2, Name: "signals"}.Drops()
	if !reflect.DeepEqual(sig, []string{"table signals"}) {
		t.Errorf("0002_signals drops %q", sig)
	}
}
