package main

import (
	"testing"

	"github.com/marconihub/marconi/internal/pgtest"
)

// TestSummaryKnowsTheBusKeyFromTheStart: an instance on Postgres, started
// and then restarted, shows in the fabric summary the bus key version it
// seals with from its first heartbeat on, never null (unknown) while it
// lives. Heartbeats are a minute apart, so a first one without the version
// would show null for a minute.
func TestSummaryKnowsTheBusKeyFromTheStart(t *testing.T) {
	db := pgtest.Schema(t)
	const admin = "e2e-admin-0123456789abcdef"
	kv := func() map[string]string {
		return map[string]string{
			"MARCONI_DATABASE_URL": db, "MARCONI_MODE": "lan",
			"MARCONI_API_KEYS": "e2e-key-0123456789abcdef=t/p", "MARCONI_ADMIN_TOKEN": admin,
			"MARCONI_INSTANCE_ID": "hub-a", "MARCONI_PUBLIC_URL": "http://hub-a.example",
			"MARCONI_INSTANCE_HEARTBEAT_SECONDS": "60", "MARCONI_INSTANCE_DEAD_AFTER_SECONDS": "180",
		}
	}
	// hubA is hub-a's row in the summary, nil until it has one.
	hubA := func(m *Main) map[string]any {
		_, s := fabricCall(t, "GET", m.URL()+"/v1/ops/fabric/summary", admin, nil)
		ins, _ := s["instances"].([]any)
		for _, in := range ins {
			if row := in.(map[string]any); row["instance_id"] == "hub-a" {
				return row
			}
		}
		return nil
	}

	first, _ := startMain(t, kv())
	var row map[string]any
	pollUntil(t, "hub-a in the summary", func() bool { row = hubA(first); return row != nil })
	if row["bus_key_version"] != float64(1) {
		t.Fatalf("hub-a at its first heartbeat: bus_key_version %v, want 1 (the key migration 0008 made)", row["bus_key_version"])
	}
	if err := first.Close(); err != nil { // its last write marks hub-a draining
		t.Fatal(err)
	}

	again, _ := startMain(t, kv())
	pollUntil(t, "the restarted hub-a's first heartbeat", func() bool {
		row = hubA(again)
		return row != nil && row["draining"] == false
	})
	if row["bus_key_version"] != float64(1) {
		t.Fatalf("hub-a at its first heartbeat after a restart: bus_key_version %v, want 1", row["bus_key_version"])
	}
}
