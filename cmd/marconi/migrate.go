package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/migrations"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// migrateUsages is each migrate subcommand's usage, as -h prints it.
var migrateUsages = map[string]string{
	"": "usage: marconi migrate up | down [N | --all] [--yes] [--force] | version\n\n" +
		"Applies, steps back or shows the Postgres schema (MARCONI_DATABASE_URL or --database-url).\n" +
		"Run 'marconi migrate up -h', 'down -h' or 'version -h' for each.",
	"up": "usage: marconi migrate up [--database-url URL]\n\n" +
		"Applies every migration not yet applied, printing each step. The hub also does this at start.",
	"down": "usage: marconi migrate down [N | --all] [--yes] [--force] [--database-url URL]\n\n" +
		"Reverts the last N migrations (default 1), or all of them, printing each step. It first lists\n" +
		"what each step drops, then asks for confirmation on a terminal (without one, --yes is required),\n" +
		"and refuses while any instance heartbeated within MARCONI_INSTANCE_DEAD_AFTER_SECONDS (--force\n" +
		"goes on anyway: a running hub on a schema behind it fails its calls).",
	"version": "usage: marconi migrate version [--database-url URL]\n\n" +
		"Prints the schema version and whether a migration failed halfway (dirty).",
}

// migrateUsage is the one-line reminder a usage error ends with.
const migrateUsage = "usage: marconi migrate up | down [N|--all] [--yes] [--force] | version"

// migrateFlags are the flags of `marconi migrate`.
type migrateFlags struct {
	dbURL           string
	all, yes, force bool
	fs              *flag.FlagSet
	positional      []string
}

func (c cli) parseMigrate(args []string) (*migrateFlags, error) {
	f := &migrateFlags{fs: flag.NewFlagSet("marconi migrate", flag.ContinueOnError)}
	f.fs.SetOutput(io.Discard)
	f.fs.StringVar(&f.dbURL, "database-url", c.getenv("MARCONI_DATABASE_URL"), "Postgres URL (env MARCONI_DATABASE_URL)")
	f.fs.BoolVar(&f.all, "all", false, "down: revert every migration (drops all of Marconi's tables)")
	f.fs.BoolVar(&f.yes, "yes", false, "down: do not ask for confirmation (required without a terminal)")
	f.fs.BoolVar(&f.force, "force", false, "down: go on while instances are heartbeating")
	var err error
	f.positional, err = parseInterleaved(f.fs, args)
	return f, err
}

// dbURLSource names where the database URL came from: the flag when it was
// given, else the environment variable.
func (f *migrateFlags) dbURLSource() string {
	src := "MARCONI_DATABASE_URL"
	f.fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "database-url" {
			src = "--database-url"
		}
	})
	return src
}

// migrate is `marconi migrate up|down|version`.
func (c cli) migrate(ctx context.Context, args []string) error {
	f, err := c.parseMigrate(args)
	sub := ""
	if len(f.positional) > 0 {
		sub = f.positional[0]
	}
	if errors.Is(err, flag.ErrHelp) {
		text, ok := migrateUsages[sub]
		if !ok {
			text = migrateUsages[""]
		}
		fmt.Fprintln(c.stdout, text)
		fmt.Fprintln(c.stdout)
		f.fs.SetOutput(c.stdout)
		f.fs.PrintDefaults()
		return err
	}
	if err != nil {
		return usagef("%v; %s", flagError(f.fs, err), migrateUsage)
	}
	if sub == "" {
		return usagef(migrateUsage)
	}
	if _, ok := migrateUsages[sub]; !ok {
		msg := fmt.Sprintf("unknown migrate command %q", sub)
		if s := closest(sub, []string{"up", "down", "version"}); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return usagef("%s; %s", msg, migrateUsage)
	}
	rest := f.positional[1:]
	if f.dbURL == "" {
		return usagef("no database: set MARCONI_DATABASE_URL or --database-url")
	}
	if err := checkDatabaseURL(f.dbURL); err != nil {
		return usagef("%s: %v", f.dbURLSource(), err)
	}
	if (f.all || f.yes || f.force) && sub != "down" {
		return usagef("--all, --yes and --force apply to down only; %s", migrateUsage)
	}
	progress := migrations.WithProgress(func(m migrations.Migration, d migrations.Direction) {
		verb := map[migrations.Direction]string{migrations.DirectionUp: "applied", migrations.DirectionDown: "reverted"}[d]
		fmt.Fprintf(c.stdout, "%s %s\n", verb, m)
	})
	switch sub {
	case "up", "version":
		if len(rest) > 0 {
			return usagef("unexpected arguments %q; %s", rest, migrateUsage)
		}
		if sub == "up" {
			if err := migrations.Up(ctx, f.dbURL, progress); err != nil {
				return err
			}
		}
	case "down":
		if err := c.migrateDown(ctx, f, rest, progress); err != nil {
			return err
		}
	}
	v, dirty, err := migrations.Version(f.dbURL)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "schema version %d (dirty %v)\n", v, dirty)
	return nil
}

// migrateDown lists what the steps drop, refuses while instances run
// (unless --force), asks for confirmation (unless --yes), then reverts.
func (c cli) migrateDown(ctx context.Context, f *migrateFlags, rest []string, progress migrations.Option) error {
	n, err := downCount(rest, f.all)
	if err != nil {
		return err
	}
	v, dirty, err := migrations.Version(f.dbURL)
	if err != nil {
		return err
	}
	if dirty {
		return fmt.Errorf("the schema is dirty at version %d (a migration failed halfway); repair it by hand first (docs/operations.md, Migrations)", v)
	}
	plan, err := downPlan(v, n)
	if err != nil {
		return err
	}
	if len(plan) == 0 {
		fmt.Fprintln(c.stdout, "nothing to revert: no migration is applied")
		return nil
	}
	if err := c.printDownPlan(v, plan); err != nil {
		return err
	}
	if !f.force {
		if err := refuseWhileLive(ctx, f.dbURL, c.getenv); err != nil {
			return err
		}
	}
	if !f.yes {
		if !c.terminal {
			return usagef("not on a terminal, so nothing was changed; pass --yes to confirm")
		}
		fmt.Fprint(c.stdout, "This deletes the data listed above. Type \"yes\" to go on: ")
		line, _ := bufio.NewReader(c.stdin).ReadString('\n')
		if strings.TrimSpace(line) != "yes" {
			return errors.New("not confirmed; nothing was changed")
		}
	}
	if f.all {
		return migrations.Down(ctx, f.dbURL, progress)
	}
	return migrations.Steps(ctx, f.dbURL, -n, progress)
}

// downCount is how many steps `migrate down` reverts: 1, N, or -1 for all.
func downCount(rest []string, all bool) (int, error) {
	switch {
	case all && len(rest) > 0:
		return 0, usagef("down --all takes no count; %s", migrateUsage)
	case all:
		return -1, nil
	case len(rest) > 1:
		return 0, usagef("unexpected arguments %q; %s", rest[1:], migrateUsage)
	case len(rest) == 0:
		return 1, nil
	}
	n, err := strconv.Atoi(rest[0])
	if err != nil || n < 1 {
		return 0, usagef("down takes a positive count of migrations, got %q; %s", rest[0], migrateUsage)
	}
	return n, nil
}

// downPlan is the migrations that stepping back n (-1: all) from version v
// reverts, newest first.
func downPlan(v uint, n int) ([]migrations.Migration, error) {
	var applied []migrations.Migration
	all := migrations.All()
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].Version <= v {
			applied = append(applied, all[i])
		}
	}
	if v > migrations.Latest() {
		return nil, fmt.Errorf("the schema is at version %d, ahead of this binary (it knows up to %d): step back with the binary that migrated it", v, migrations.Latest())
	}
	if n == -1 {
		return applied, nil
	}
	if n > len(applied) {
		return nil, fmt.Errorf("cannot step back %d: only %d applied", n, len(applied))
	}
	return applied[:n], nil
}

func (c cli) printDownPlan(v uint, plan []migrations.Migration) error {
	to := uint(0) // the version before the oldest step reverted
	for _, m := range migrations.All() {
		if m.Version < plan[len(plan)-1].Version {
			to = m.Version
		}
	}
	fmt.Fprintf(c.stdout, "migrate down: from schema version %d to %d, reverting:\n", v, to)
	for _, m := range plan {
		drops, err := m.Drops()
		if err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "  %s drops: %s\n", m, strings.Join(drops, ", "))
	}
	return nil
}

// refuseWhileLive fails when an instance heartbeated within the dead-after
// window: a hub running on a schema behind it fails its calls.
func refuseWhileLive(ctx context.Context, dbURL string, getenv func(string) string) error {
	window := fabric.DefaultDeadAfter
	if v := getenv("MARCONI_INSTANCE_DEAD_AFTER_SECONDS"); v != "" {
		if err := seconds(&window)(nil, v); err != nil {
			return usagef("MARCONI_INSTANCE_DEAD_AFTER_SECONDS: %v", err)
		}
	}
	live, err := liveInstances(ctx, dbURL, window)
	if err != nil {
		return fmt.Errorf("list the running instances: %w", err)
	}
	if len(live) == 0 {
		return nil
	}
	return fmt.Errorf("refused: %d instance(s) heartbeated within the last %v (MARCONI_INSTANCE_DEAD_AFTER_SECONDS): %s; stop every hub and wait that long, or pass --force; nothing was changed",
		len(live), window, strings.Join(live, ", "))
}

// liveInstances lists the instances whose last heartbeat is younger than
// window, by the database's clock, as "id (3s ago)".
func liveInstances(ctx context.Context, dbURL string, window time.Duration) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, errors.New("malformed database URL")
	}
	defer pool.Close()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('instances') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT id, greatest(extract(epoch FROM now() - last_heartbeat_at), 0)::int FROM instances
		WHERE last_heartbeat_at > now() - make_interval(secs => $1) ORDER BY id`, window.Seconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		var ago int
		if err := rows.Scan(&id, &ago); err != nil {
			return nil, err
		}
		out = append(out, fmt.Sprintf("%s (%ds ago)", id, ago))
	}
	return out, rows.Err()
}

// schemaCheck is hub.Deps.Schema for the Postgres store st: /readyz fails
// while the schema is behind this binary, ahead of it, or dirty.
func schemaCheck(st *pgstore.Store) func(context.Context) error {
	return func(ctx context.Context) error {
		v, dirty, err := st.SchemaVersion(ctx)
		if err != nil {
			return err
		}
		return schemaVerdict(v, dirty, migrations.Latest())
	}
}

// unfixable is the mismatch of a schema that applying this binary's
// migrations cannot fix (ahead of the binary, or dirty), or nil.
func unfixable(ctx context.Context, schema func(context.Context) error) *hub.SchemaMismatch {
	var sm *hub.SchemaMismatch
	if schema == nil || !errors.As(schema(ctx), &sm) || sm.Class == classBehind {
		return nil
	}
	return sm
}

// classBehind is the public class of a schema behind the binary.
const classBehind = "schema behind this binary"

// schemaVerdict compares the schema's version with the one the binary needs.
func schemaVerdict(v uint, dirty bool, latest uint) error {
	switch {
	case dirty:
		return &hub.SchemaMismatch{Class: "schema dirty", Refuse: true,
			Detail: fmt.Sprintf("schema dirty at version %d: a migration failed halfway (the hub's log says why); repair it by hand (docs/operations.md, Migrations)", v)}
	case v < latest:
		return &hub.SchemaMismatch{Class: classBehind, Refuse: true,
			Detail: fmt.Sprintf("schema at version %d, this binary needs %d: run marconi migrate up, or restart the hub", v, latest)}
	case v > latest:
		return &hub.SchemaMismatch{Class: "schema ahead of this binary",
			Detail: fmt.Sprintf("schema at version %d, this binary knows up to %d: run the newer binary", v, latest)}
	}
	return nil
}
