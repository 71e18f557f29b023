package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
)

// TestBusKeyRotateCommand runs `marconi buskey` against two hub processes
// on one database: rotate on one, and the other seals with the new key
// within MARCONI_BUS_KEY_REFRESH_SECONDS, as `buskey show` on it says; the
// key is never printed; each bad use exits with its code and names it.
func TestBusKeyRotateCommand(t *testing.T) {
	db := pgtest.Schema(t)
	dbURL, proxy := viaProxy(t, db)
	const key, admin = "e2e-key-0123456789abcdef", "e2e-admin-0123456789abcdef"
	common := func(id, u string) map[string]string {
		return map[string]string{
			"MARCONI_DATABASE_URL": u, "MARCONI_MODE": "lan",
			"MARCONI_API_KEYS": key + "=t/p", "MARCONI_ADMIN_TOKEN": admin,
			"MARCONI_INSTANCE_ID": id, "MARCONI_PUBLIC_URL": "http://" + id + ".example",
			"MARCONI_BUS_KEY_REFRESH_SECONDS": "1", "MARCONI_BUS_KEY_GRACE_SECONDS": "5",
			"MARCONI_STORE_TIMEOUT_SECONDS": "2",
		}
	}
	a, _ := startMain(t, common("hub-a", dbURL))
	b, _ := startMain(t, common("hub-b", db))
	withToken := map[string]string{"MARCONI_ADMIN_TOKEN": admin}

	pollUntil(t, "hub-b reads the bus key", func() bool {
		_, out, _ := runCLI(t, withToken, "", false, "buskey", "show", b.URL())
		return strings.Contains(out, "instance hub-b seals with version 1")
	})
	code, out, errOut := runCLI(t, withToken, "", false, "buskey", "rotate", a.URL()+"/")
	if code != 0 || !strings.Contains(out, "bus key rotated: version 2") || !strings.Contains(out, "within 1s") {
		t.Fatalf("buskey rotate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	pollUntil(t, "hub-b seals with the rotated key", func() bool {
		_, out, _ := runCLI(t, withToken, "", false, "buskey", "show", b.URL())
		return strings.Contains(out, "bus key version 2") && strings.Contains(out, "instance hub-b seals with version 2")
	})
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var cur, prev []byte
	if err := conn.QueryRow(context.Background(), `SELECT key, previous FROM bus_key`).Scan(&cur, &prev); err != nil {
		t.Fatal(err)
	}
	for _, k := range [][]byte{cur, prev} {
		for _, form := range []string{hex.EncodeToString(k), base64.StdEncoding.EncodeToString(k), base64.RawURLEncoding.EncodeToString(k)} {
			if strings.Contains(out, form) || bytes.Contains([]byte(out), k) {
				t.Fatalf("buskey rotate printed a key: %q", out)
			}
		}
	}

	mem, _ := startMain(t, map[string]string{"MARCONI_ADMIN_TOKEN": admin, "MARCONI_MODE": "lan", "MARCONI_API_KEYS": key + "=t/p"})
	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stderr string
	}{
		{"no token", nil, []string{"rotate", a.URL()}, 2, "MARCONI_ADMIN_TOKEN is not set"},
		{"not the admin", map[string]string{"MARCONI_ADMIN_TOKEN": key}, []string{"rotate", a.URL()}, 1, "unauthorized (401 Unauthorized)"},
		{"no subcommand", withToken, []string{a.URL()}, 2, "usage: marconi buskey show|rotate [HUB_URL]"},
		{"unknown subcommand", withToken, []string{"spin", a.URL()}, 2, "usage: marconi buskey show|rotate [HUB_URL]"},
		{"in-memory hub", withToken, []string{"rotate", mem.URL()}, 1, "not_found (404 Not Found): this hub has no bus key"},
		{"no hub there", withToken, []string{"rotate", "http://" + closedPortAddr}, 1, "cannot reach the hub"},
	} {
		code, out, errOut := runCLI(t, tc.env, "", false, append([]string{"buskey"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.stderr) || out != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d naming %q", tc.name, code, out, errOut, tc.code, tc.stderr)
		}
	}

	// hub-a loses the database: the rotation is refused, and nothing rotated.
	proxy.Cut()
	code, out, errOut = runCLI(t, withToken, "", false, "buskey", "rotate", a.URL())
	if code != 1 || !strings.Contains(errOut, "registry_unavailable (503 Service Unavailable)") || out != "" {
		t.Errorf("rotate with the store unreachable: exit %d, stdout %q, stderr %q; want exit 1, registry_unavailable", code, out, errOut)
	}
	if _, out, _ := runCLI(t, withToken, "", false, "buskey", "show", b.URL()); !strings.Contains(out, "bus key version 2") {
		t.Errorf("after a refused rotation: %q, want version 2 still", out)
	}
}

// TestBusKeyGraceMustOutlastRefresh: a grace no longer than the refresh
// would drop the wake-ups of an instance that has not yet read a rotation.
func TestBusKeyGraceMustOutlastRefresh(t *testing.T) {
	for _, kv := range []map[string]string{
		{"MARCONI_BUS_KEY_REFRESH_SECONDS": "60", "MARCONI_BUS_KEY_GRACE_SECONDS": "60"},
		{"MARCONI_BUS_KEY_GRACE_SECONDS": "10"},
	} {
		_, err := LoadConfig(nil, env(kv), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "MARCONI_BUS_KEY_GRACE_SECONDS: must be longer than MARCONI_BUS_KEY_REFRESH_SECONDS") {
			t.Errorf("%v: %v, want a refusal naming both", kv, err)
		}
	}
	for _, v := range []string{"0", "9", "x"} {
		if _, err := LoadConfig(nil, env(map[string]string{"MARCONI_BUS_KEY_RECHECK_MS": v}), &bytes.Buffer{}); err == nil ||
			!strings.Contains(err.Error(), "MARCONI_BUS_KEY_RECHECK_MS") {
			t.Errorf("MARCONI_BUS_KEY_RECHECK_MS=%s: %v", v, err)
		}
	}
	c, err := LoadConfig(nil, env(map[string]string{"MARCONI_BUS_KEY_REFRESH_SECONDS": "5", "MARCONI_BUS_KEY_GRACE_SECONDS": "20", "MARCONI_BUS_KEY_RECHECK_MS": "250"}), &bytes.Buffer{})
	if err != nil || c.BusKey.Refresh.Seconds() != 5 || c.BusKey.Grace.Seconds() != 20 || c.BusKey.Recheck.Milliseconds() != 250 {
		t.Fatalf("bus key settings: %v, %+v", err, c.BusKey)
	}
}
