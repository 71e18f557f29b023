package main

import (
	"context"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
)

// fleet -bus-url takes a NATS server on this machine only, and adds a run
// of three instances on it to each round of -marconi (not of -before).
func TestFleetBusURL(t *testing.T) {
	base := []string{"-database-url", "postgres://postgres@127.0.0.1:5432/f", "-haproxy-config", "../../deploy/haproxy.cfg", "-marconi", "new", "-before", "old"}
	for _, bad := range []string{"http://127.0.0.1:4222", "nats://nats.example.org:4222", "127.0.0.1:4222"} {
		_, err := parseFleetOptions(append(base, "-bus-url", bad), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-bus-url") {
			t.Errorf("-bus-url %q: err %v, want a -bus-url error", bad, err)
		}
	}
	o, err := parseFleetOptions(base, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []fleetConfig{{instances: 1, bus: busNOTIFY}, {instances: 3, bus: busNOTIFY}}
	if got := fleetConfigs(o, "new"); !reflect.DeepEqual(got, want) {
		t.Errorf("without -bus-url: runs %v, want %v", got, want)
	}
	o, err = parseFleetOptions(append(base, "-bus-url", "nats://127.0.0.1:4222"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := fleetConfigs(o, "old"); !reflect.DeepEqual(got, want) {
		t.Errorf("-before with -bus-url: runs %v, want %v", got, want)
	}
	want = append(want, fleetConfig{instances: 3, bus: busNATS})
	if got := fleetConfigs(o, "new"); !reflect.DeepEqual(got, want) {
		t.Errorf("-marconi with -bus-url: runs %v, want %v", got, want)
	}
}

// fleet -instances picks the fleet sizes of a round: 1, 3 or both, and
// nothing else; the runs of a round follow it.
func TestParseFleetInstances(t *testing.T) {
	db := "postgres://postgres@127.0.0.1:5432/fleet?sslmode=disable"
	cfg := "../../deploy/haproxy.cfg"
	for _, tc := range []struct {
		arg  string
		want []int
	}{
		{"", []int{1, fleetInstances}},
		{"1", []int{1}},
		{"3", []int{fleetInstances}},
		{"1,3", []int{1, fleetInstances}},
	} {
		args := []string{"-database-url", db, "-haproxy-config", cfg}
		if tc.arg != "" {
			args = append(args, "-instances", tc.arg)
		}
		o, err := parseFleetOptions(args, io.Discard)
		if err != nil {
			t.Fatalf("-instances %q: %v", tc.arg, err)
		}
		if !reflect.DeepEqual(o.instances, tc.want) {
			t.Errorf("-instances %q: got %v, want %v", tc.arg, o.instances, tc.want)
		}
	}
	o, err := parseFleetOptions([]string{"-database-url", db, "-haproxy-config", cfg, "-instances", "1", "-bus-url", "nats://127.0.0.1:4222"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fleetConfigs(o, o.marconi), []fleetConfig{{instances: 1, bus: busNOTIFY}}; !reflect.DeepEqual(got, want) {
		t.Errorf("-instances 1 with -bus-url: runs %v, want %v", got, want)
	}
	for _, bad := range []string{"2", "3,1", "0", "1,2,3", "x"} {
		_, err := parseFleetOptions([]string{"-database-url", db, "-haproxy-config", cfg, "-instances", bad}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-instances") {
			t.Errorf("-instances %q: got %v, want an -instances error", bad, err)
		}
	}
}

// fleet -gomaxprocs adds to each round of -marconi a run of three instances
// with that GOMAXPROCS, on NATS with -bus-url, and refuses what is out of
// range; -profile needs whole seconds to profile.
func TestFleetGOMAXPROCS(t *testing.T) {
	base := []string{"-database-url", "postgres://postgres@127.0.0.1:5432/f", "-haproxy-config", "../../deploy/haproxy.cfg", "-marconi", "new", "-before", "old"}
	for _, bad := range []string{"-1", "65"} {
		_, err := parseFleetOptions(append(base, "-gomaxprocs", bad), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-gomaxprocs") {
			t.Errorf("-gomaxprocs %s: err %v, want a -gomaxprocs error", bad, err)
		}
	}
	o, err := parseFleetOptions(append(base, "-gomaxprocs", "1", "-bus-url", "nats://127.0.0.1:4222"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []fleetConfig{{instances: 1, bus: busNOTIFY}, {instances: 3, bus: busNOTIFY}}
	if got := fleetConfigs(o, "old"); !reflect.DeepEqual(got, want) {
		t.Errorf("-before with -gomaxprocs: runs %v, want %v", got, want)
	}
	want = append(want, fleetConfig{instances: 3, bus: busNATS}, fleetConfig{instances: 3, bus: busNATS, procs: 1})
	if got := fleetConfigs(o, "new"); !reflect.DeepEqual(got, want) {
		t.Errorf("-marconi with -gomaxprocs and -bus-url: runs %v, want %v", got, want)
	}
	if got := want[3].label(); got != "NATS-P1" {
		t.Errorf("label %q, want NATS-P1", got)
	}
	o, err = parseFleetOptions(append(base, "-gomaxprocs", "2"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := fleetConfigs(o, "new")[2]; got != (fleetConfig{instances: 3, bus: busNOTIFY, procs: 2}) {
		t.Errorf("-gomaxprocs without -bus-url: run %v, want three on NOTIFY with GOMAXPROCS 2", got)
	}
	o, err = parseFleetOptions(append(base, "-alt-haproxy-config", "../../deploy/haproxy.cfg", "-bus-url", "nats://127.0.0.1:4222"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := fleetConfigs(o, "new")[3]; got != (fleetConfig{instances: 3, bus: busNATS, altLB: true}) || got.label() != "NATS-altLB" {
		t.Errorf("-alt-haproxy-config: run %v (%s), want three on NATS behind it", got, got.label())
	}
	o, err = parseFleetOptions(append(base, "-alt-haproxy-config", "../../deploy/haproxy.cfg", "-gomaxprocs", "1"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := fleetConfigs(o, "new"); len(got) != 5 || got[4] != (fleetConfig{instances: 3, bus: busNOTIFY, procs: 1, altLB: true}) || got[4].label() != "NOTIFY-P1-altLB" {
		t.Errorf("-alt-haproxy-config with -gomaxprocs: runs %v, want the two together last", got)
	}
	if _, err := parseFleetOptions(append(base, "-alt-haproxy-config", "no-such.cfg"), io.Discard); err == nil || !strings.Contains(err.Error(), "-alt-haproxy-config") {
		t.Errorf("-alt-haproxy-config no-such.cfg: err %v, want an -alt-haproxy-config error", err)
	}
	_, err = parseFleetOptions(append(base, "-profile", t.TempDir(), "-duration", "500ms"), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-profile") {
		t.Errorf("-profile with -duration 500ms: err %v, want a -profile error", err)
	}
}

func TestParseMachineTicks(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	got := parseMachineTicks("cpu  100 2 30 500 7 0 11 5 40 3\ncpu0 50 1 15 250 3 0 5 2 20 1\n")
	if want := (machineTicks{total: 100 + 2 + 30 + 500 + 7 + 0 + 11 + 5, idle: 500 + 7}); got != want {
		t.Fatalf("parseMachineTicks = %+v, want %+v (guest time is part of user time, idle counts iowait)", got, want)
	}
	for _, bad := range []string{"", "intr 1 2 3\n", "cpu 1 2\n"} {
		if got := parseMachineTicks(bad); got != (machineTicks{}) {
			t.Errorf("parseMachineTicks(%q) = %+v, want zero", bad, got)
		}
	}
}

// TestSettleDatabaseVacuumsAndCheckpoints runs a step's settling on a
// migrated schema of the real Postgres: the server checkpoints, and the
// tables a step writes are vacuumed.
func TestSettleDatabaseVacuumsAndCheckpoints(t *testing.T) {
	url, conn := schemaConn(t)
	ctx := t.Context()
	// The control file's last checkpoint moves once a checkpoint is done,
	// before CHECKPOINT returns (pg_stat_bgwriter's counters are reported
	// later, and a checkpoint another test asked for meanwhile merges).
	checkpoint := func() string {
		var lsn string
		if err := conn.QueryRow(ctx, `SELECT checkpoint_lsn::text FROM pg_control_checkpoint()`).Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	if _, err := conn.Exec(ctx, `INSERT INTO project_usage_deltas (tenant_id, project_id, delta)
		SELECT 't', 'p', g FROM generate_series(1, 500) AS g`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `DELETE FROM project_usage_deltas`); err != nil {
		t.Fatal(err)
	}
	before := checkpoint()
	var start time.Time
	if err := conn.QueryRow(ctx, `SELECT now()`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	if err := settleDatabase(ctx, url); err != nil {
		t.Fatalf("settleDatabase: %v", err)
	}
	if after := checkpoint(); after == before {
		t.Errorf("the last checkpoint is at %s before and after: settleDatabase did not checkpoint", after)
	}
	// Whether VACUUM could remove the dead rows depends on every other
	// transaction of the database (other tests'), so ask whether it ran.
	// Every table of the hubs' schema is vacuumed, but those a step does
	// not write, or writes a row or two of.
	rows, err := conn.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema()
		AND tablename NOT IN ('schema_migrations', 'api_keys', 'bus_key', 'counters', 'fallback_events')`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != len(settledTables) {
		t.Errorf("the schema's tables written by a step are %v; settleDatabase vacuums %v", tables, settledTables)
	}
	for _, table := range tables {
		var vacuumed bool
		if err := conn.QueryRow(ctx, `SELECT coalesce(last_vacuum >= $1, false) FROM pg_stat_user_tables
			WHERE relid = $2::regclass`, start, table).Scan(&vacuumed); err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		if !vacuumed {
			t.Errorf("%s was not vacuumed by settleDatabase", table)
		}
	}
}

func TestFleetStatementsOption(t *testing.T) {
	base := []string{"-database-url", "postgres://postgres@127.0.0.1:5432/f", "-haproxy-config", "../../deploy/haproxy.cfg"}
	for _, bad := range []string{"-1", "21"} {
		if _, err := parseFleetOptions(append(base, "-statements", bad), io.Discard); err == nil || !strings.Contains(err.Error(), "-statements") {
			t.Errorf("-statements %s: err %v, want a refusal naming -statements", bad, err)
		}
	}
	o, err := parseFleetOptions(append(base, "-statements", "5"), io.Discard)
	if err != nil || o.statements != 5 {
		t.Fatalf("-statements 5: %+v, %v", o.statements, err)
	}
}

func TestStatementStart(t *testing.T) {
	if got, want := statementStart("  WITH o AS (\n\tSELECT seq\n\tFROM signals )  "), "WITH o AS ( SELECT seq FROM signals )"; got != want {
		t.Errorf("statementStart = %q, want %q", got, want)
	}
	long := strings.Repeat("x", 100)
	if got := statementStart(long); got != strings.Repeat("x", 60)+"…" {
		t.Errorf("statementStart of 100 bytes = %q, want its first 60 and an ellipsis", got)
	}
}

// -statements on a server that does not preload pg_stat_statements (as
// CI's) is refused with what to change, and creates nothing; on one that
// does, the extension is there afterwards.
func TestEnableStatements(t *testing.T) {
	url, conn := schemaConn(t)
	ctx := t.Context()
	var preloads string
	if err := conn.QueryRow(ctx, `SELECT current_setting('shared_preload_libraries')`).Scan(&preloads); err != nil {
		t.Fatal(err)
	}
	err := enableStatements(ctx, url)
	if !strings.Contains(preloads, "pg_stat_statements") {
		if err == nil || !strings.Contains(err.Error(), "shared_preload_libraries") {
			t.Fatalf("enableStatements without the module preloaded: %v, want a refusal naming shared_preload_libraries", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("enableStatements with the module preloaded: %v", err)
	}
	if _, err := topStatements(ctx, url, 3); err != nil {
		t.Fatalf("topStatements: %v", err)
	}
}

func TestParentPID(t *testing.T) {
	if got, want := parentPID(os.Getpid()), os.Getppid(); got != want {
		t.Errorf("parentPID(self) = %d, want %d", got, want)
	}
	if got := parentPID(-1); got != 0 {
		t.Errorf("parentPID(-1) = %d, want 0", got)
	}
}

// The server's CPU counts the backend's own: a backend that has just
// worked is part of the sum.
func TestServerCPUCountsItsBackends(t *testing.T) {
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pgtest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		t.Fatal(err)
	}
	if parentPID(backend) == 0 {
		// CI's Postgres runs on this machine: there the test must run.
		if os.Getenv(pgtest.EnvRequire) == "1" {
			t.Fatalf("the Postgres backend %d is not a process of this machine's /proc, and %s=1", backend, pgtest.EnvRequire)
		}
		t.Skip("the Postgres backend is not a process of this machine's /proc (another host or pid namespace)")
	}
	var n int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM generate_series(1, 5000000)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	own, all := processCPU(backend), serverCPU(backend)
	if own <= 0 || all < own {
		t.Errorf("backend CPU %s, server CPU %s: want the backend's (after 5M rows) counted in the server's", own, all)
	}
}

// schemaConn is a connection to a fresh migrated schema of the test
// database, and the schema's URL.
func schemaConn(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	url := pgtest.Schema(t)
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return url, conn
}

// fleet and durable -load-profile take a file in a directory that exists;
// a fleet of one run writes that file, of several one file per run, named
// by its run.
func TestLoadProfileFlag(t *testing.T) {
	dir := t.TempDir()
	db := "postgres://postgres@127.0.0.1:5432/f"
	base := []string{"-database-url", db, "-haproxy-config", "../../deploy/haproxy.cfg"}
	file := dir + "/cc.prof"
	for _, bad := range []string{dir + "/no-such-dir/cc.prof", dir + "/"} {
		if _, err := parseFleetOptions(append(base, "-load-profile", bad), io.Discard); err == nil || !strings.Contains(err.Error(), "-load-profile") {
			t.Errorf("fleet -load-profile %q: err %v, want a -load-profile error", bad, err)
		}
		if _, err := parseDurableOptions([]string{"-database-url", db, "-load-profile", bad}, io.Discard); err == nil || !strings.Contains(err.Error(), "-load-profile") {
			t.Errorf("durable -load-profile %q: err %v, want a -load-profile error", bad, err)
		}
	}
	o, err := parseDurableOptions([]string{"-database-url", db, "-load-profile", file}, io.Discard)
	if err != nil || o.loadProfile != file {
		t.Errorf("durable -load-profile %s: %q, %v", file, o.loadProfile, err)
	}
	for _, tc := range []struct {
		args []string
		runs int
	}{
		{[]string{"-instances", "1", "-rounds", "1"}, 1},
		{[]string{"-instances", "1", "-rounds", "2"}, 2},
		{[]string{"-instances", "1", "-rounds", "1", "-before", "old"}, 2},
		{[]string{"-rounds", "1"}, 2},
		{[]string{"-rounds", "2", "-bus-url", "nats://127.0.0.1:4222", "-before", "old"}, 10},
	} {
		o, err := parseFleetOptions(append(append(base, "-load-profile", file), tc.args...), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if o.loadProfile != file {
			t.Errorf("%v: loadProfile %q, want %q", tc.args, o.loadProfile, file)
		}
		if got := fleetRuns(o); got != tc.runs {
			t.Errorf("%v: %d runs, want %d", tc.args, got, tc.runs)
		}
	}
	if got, want := loadProfilePath(file, ""), file; got != want {
		t.Errorf("one run: %q, want %q", got, want)
	}
	if got, want := loadProfilePath(file, "r1-after-1-NOTIFY"), dir+"/cc-r1-after-1-NOTIFY.prof"; got != want {
		t.Errorf("a run of several: %q, want %q", got, want)
	}
	if got, want := loadProfilePath(dir+"/load", "r2-before-3-NATS"), dir+"/load-r2-before-3-NATS"; got != want {
		t.Errorf("no extension: %q, want %q", got, want)
	}
}

// A load profile covers the window between the marks and is a CPU
// profile pprof reads; the marks it wraps still run.
func TestWithLoadProfileWritesTheWindow(t *testing.T) {
	path := t.TempDir() + "/load.prof"
	var started, ended bool
	marks, done := withLoadProfile(&stepMarks{start: func() { started = true }, end: func() { ended = true }}, path)
	marks.start()
	marks.end()
	if err := done(); err != nil {
		t.Fatal(err)
	}
	if !started || !ended {
		t.Errorf("inner marks: start %v, end %v, want both run", started, ended)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A CPU profile is a gzipped protocol buffer.
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("%s: %d bytes, not a gzipped profile", path, len(b))
	}
	// The profiler is free again: another window can be profiled.
	marks, done = withLoadProfile(nil, path)
	marks.start()
	marks.end()
	if err := done(); err != nil {
		t.Errorf("a second window: %v", err)
	}
}

// fleet -public-url takes balancer (the default), direct or both: the
// three-instance runs of a round publish their balancer paths, their own
// addresses, or each in turn; one instance has no balancer to skip.
func TestFleetPublicURL(t *testing.T) {
	base := []string{"-database-url", "postgres://postgres@127.0.0.1:5432/f", "-haproxy-config", "../../deploy/haproxy.cfg", "-marconi", "new", "-before", "old"}
	for _, bad := range []string{"", "Direct", "http://127.0.0.1:8080", "balancer,direct"} {
		_, err := parseFleetOptions(append(base, "-public-url", bad), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-public-url") {
			t.Errorf("-public-url %q: err %v, want a -public-url error", bad, err)
		}
	}
	one := fleetConfig{instances: 1, bus: busNOTIFY}
	three := fleetConfig{instances: 3, bus: busNOTIFY}
	direct := fleetConfig{instances: 3, bus: busNOTIFY, direct: true}
	for _, tc := range []struct {
		args []string
		want []fleetConfig
	}{
		{nil, []fleetConfig{one, three}},
		{[]string{"-public-url", "balancer"}, []fleetConfig{one, three}},
		{[]string{"-public-url", "direct"}, []fleetConfig{one, direct}},
		{[]string{"-public-url", "both"}, []fleetConfig{one, three, direct}},
		{[]string{"-public-url", "both", "-instances", "1"}, []fleetConfig{one}},
		{[]string{"-public-url", "both", "-gomaxprocs", "1"}, []fleetConfig{one, three, direct,
			{instances: 3, bus: busNOTIFY, procs: 1}, {instances: 3, bus: busNOTIFY, procs: 1, direct: true}}},
	} {
		o, err := parseFleetOptions(append(base, tc.args...), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := fleetConfigs(o, "new"); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v: runs %v, want %v", tc.args, got, tc.want)
		}
	}
	o, err := parseFleetOptions(append(base, "-public-url", "both", "-gomaxprocs", "1"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fleetConfigs(o, "old"), []fleetConfig{one, three, direct}; !reflect.DeepEqual(got, want) {
		t.Errorf("-before with -public-url both: runs %v, want %v", got, want)
	}
	if got := fleetConfigs(o, "new")[4].label(); got != "NOTIFY-P1-direct" {
		t.Errorf("label %q, want NOTIFY-P1-direct", got)
	}
	if got, want := fleetPublicURL("127.0.0.1:9000", "hub-2", false), "http://127.0.0.1:9000/i/hub-2"; got != want {
		t.Errorf("balancer public URL %q, want %q", got, want)
	}
	if got := fleetPublicURL("127.0.0.1:9000", "hub-2", true); got != "" {
		t.Errorf("direct public URL %q, want \"\" (the instance's own address)", got)
	}
}

// -ack-interval sets the load's clients' AckInterval in fleet, durable and
// the plain load, from 0 (the client's default) to a minute; -hub-env adds
// NAME=value pairs to every hub's environment (fleet) or marconi's
// (compare), and refuses what is not one.
func TestAckIntervalAndHubEnvFlags(t *testing.T) {
	db := "postgres://postgres@127.0.0.1:5432/f"
	fleet := []string{"-database-url", db, "-haproxy-config", "../../deploy/haproxy.cfg"}
	getenv := func(k string) string {
		if k == "MARCONI_BENCH_API_KEY" {
			return "mak_0123456789abcdef"
		}
		return ""
	}
	parse := map[string]func(args []string) (time.Duration, error){
		"fleet": func(args []string) (time.Duration, error) {
			o, err := parseFleetOptions(append(fleet, args...), io.Discard)
			return o.ackInterval, err
		},
		"durable": func(args []string) (time.Duration, error) {
			o, err := parseDurableOptions(append([]string{"-database-url", db}, args...), io.Discard)
			return o.ackInterval, err
		},
		"load": func(args []string) (time.Duration, error) {
			o, err := parseOptions(args, getenv, io.Discard)
			return o.ackInterval, err
		},
	}
	for name, p := range parse {
		for _, tc := range []struct {
			arg     string
			want    time.Duration
			wantErr bool
		}{
			{"", 0, false},
			{"250ms", 250 * time.Millisecond, false},
			{"1m", time.Minute, false},
			{"0", 0, false},
			{"-1ms", 0, true},
			{"61s", 0, true},
			{"fast", 0, true},
		} {
			var args []string
			if tc.arg != "" {
				args = []string{"-ack-interval", tc.arg}
			}
			got, err := p(args)
			switch {
			case tc.wantErr && (err == nil || !strings.Contains(err.Error(), "-ack-interval")):
				t.Errorf("%s -ack-interval %q: err %v, want an -ack-interval error", name, tc.arg, err)
			case !tc.wantErr && err != nil:
				t.Errorf("%s -ack-interval %q: %v", name, tc.arg, err)
			case !tc.wantErr && got != tc.want:
				t.Errorf("%s -ack-interval %q: %s, want %s", name, tc.arg, got, tc.want)
			}
		}
	}

	o, err := parseFleetOptions(append(fleet, "-hub-env", "GOGC=400", "-hub-env", "GOMEMLIMIT=1GiB", "-hub-env", "MARCONI_X="), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"GOGC=400", "GOMEMLIMIT=1GiB", "MARCONI_X="}; !reflect.DeepEqual(o.env, want) {
		t.Errorf("-hub-env: the hubs' extra environment %q, want %q", o.env, want)
	}
	c, err := parseCompare([]string{"-hub-env", "GOGC=200"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := (envFlag{"GOGC=200"}); !reflect.DeepEqual(c.hubEnv, want) {
		t.Errorf("compare -hub-env: %q, want %q", c.hubEnv, want)
	}
	for _, bad := range []string{"GOGC", "=400", "9X=1", "GO GC=1", "GOGC-2=1"} {
		if _, err := parseFleetOptions(append(fleet, "-hub-env", bad), io.Discard); err == nil || !strings.Contains(err.Error(), "hub-env") {
			t.Errorf("fleet -hub-env %q: err %v, want a -hub-env error", bad, err)
		}
		if _, err := parseCompare([]string{"-hub-env", bad}, io.Discard); err == nil {
			t.Errorf("compare -hub-env %q: accepted", bad)
		}
	}
	if _, err := parseOptions([]string{"-database-url", "postgres://postgres@db.example.org/x"}, getenv, io.Discard); err == nil || !strings.Contains(err.Error(), "-database-url") {
		t.Errorf("load -database-url off this machine: err %v, want a -database-url error", err)
	}
}

// fleet -projects spreads the load over that many projects: the hubs get a
// key per project, each naming a project of its own, and the load dials
// project p with benchProjectKey(p).
func TestFleetProjects(t *testing.T) {
	db := "postgres://postgres@127.0.0.1:5432/fleet?sslmode=disable"
	cfg := "../../deploy/haproxy.cfg"
	o, err := parseFleetOptions([]string{"-database-url", db, "-haproxy-config", cfg}, io.Discard)
	if err != nil || o.projects != 1 {
		t.Fatalf("default: projects %d, err %v; want 1", o.projects, err)
	}
	o, err = parseFleetOptions([]string{"-database-url", db, "-haproxy-config", cfg, "-projects", "3"}, io.Discard)
	if err != nil || o.projects != 3 {
		t.Fatalf("-projects 3: projects %d, err %v", o.projects, err)
	}
	for _, bad := range []string{"0", "-1", "65", "x"} {
		if _, err := parseFleetOptions([]string{"-database-url", db, "-haproxy-config", cfg, "-projects", bad}, io.Discard); err == nil || !strings.Contains(err.Error(), "projects") {
			t.Errorf("-projects %s: err %v, want a -projects error", bad, err)
		}
	}
	if got, want := benchAPIKeys(1), durableAPIKey+"=bench/durable"; got != want {
		t.Errorf("benchAPIKeys(1) = %q, want %q (one project, as before)", got, want)
	}
	projectOf := map[string]string{}
	for _, pair := range strings.Split(benchAPIKeys(3), ",") {
		key, project, ok := strings.Cut(pair, "=")
		if !ok || len(key) < 16 || projectOf[key] != "" {
			t.Fatalf("benchAPIKeys(3) = %q: bad or repeated pair %q", benchAPIKeys(3), pair)
		}
		projectOf[key] = project
	}
	seen := map[string]bool{}
	for p := range 3 {
		project := projectOf[benchProjectKey(p)]
		if project == "" || seen[project] {
			t.Errorf("benchProjectKey(%d) names project %q: want a key of its own project (%v)", p, project, projectOf)
		}
		seen[project] = true
	}
}
