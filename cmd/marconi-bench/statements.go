package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres's side of a fleet run (-statements): which statements its
// backends spent their time on, per send, from pg_stat_statements. The
// server must load the module (shared_preload_libraries); the extension
// is created in the bench's database when missing.

// statementCost is one statement's share of a run.
type statementCost struct {
	query       string // normalised text, its start only
	calls       int64
	execTime    time.Duration // execution, all calls
	planTime    time.Duration // planning, when the server tracks it
	buffersHit  int64         // shared buffers read (hit or not)
	walRecords  int64
	walFPI      int64   // full-page images among walRecords
	walBytes    float64 // the WAL they wrote
	rowsChanged int64
}

// enableStatements creates the extension in databaseURL's database, or
// says why it cannot be used.
func enableStatements(ctx context.Context, databaseURL string) error {
	return withConn(ctx, databaseURL, func(ctx context.Context, conn *pgx.Conn) error {
		var preloads string
		if err := conn.QueryRow(ctx, `SELECT current_setting('shared_preload_libraries')`).Scan(&preloads); err != nil {
			return fmt.Errorf("-statements: %w", err)
		}
		if !strings.Contains(preloads, "pg_stat_statements") {
			return fmt.Errorf("-statements: the server does not load pg_stat_statements (shared_preload_libraries = %q): add it and restart Postgres", preloads)
		}
		if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			return fmt.Errorf("-statements: create extension pg_stat_statements: %w", err)
		}
		return nil
	})
}

// resetStatements forgets every statement's figures, the server's whole.
func resetStatements(ctx context.Context, databaseURL string) error {
	return withConn(ctx, databaseURL, func(ctx context.Context, conn *pgx.Conn) error {
		schema, err := statementsSchema(ctx, conn)
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, `SELECT `+schema+`.pg_stat_statements_reset()`)
		return err
	})
}

// topStatements are the n statements of this database with the most
// time, planning included, since the last reset.
func topStatements(ctx context.Context, databaseURL string, n int) ([]statementCost, error) {
	var out []statementCost
	err := withConn(ctx, databaseURL, func(ctx context.Context, conn *pgx.Conn) error {
		schema, err := statementsSchema(ctx, conn)
		if err != nil {
			return err
		}
		rows, err := conn.Query(ctx, `SELECT query, calls, total_exec_time, total_plan_time,
				shared_blks_hit + shared_blks_read, wal_records, wal_fpi, wal_bytes::float8, rows
			FROM `+schema+`.pg_stat_statements
			WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND query NOT LIKE '%pg_stat_statements%'
			ORDER BY total_exec_time + total_plan_time DESC LIMIT $1`, n)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c statementCost
			var exec, plan float64 // milliseconds
			if err := rows.Scan(&c.query, &c.calls, &exec, &plan, &c.buffersHit, &c.walRecords, &c.walFPI, &c.walBytes, &c.rowsChanged); err != nil {
				return err
			}
			c.execTime = time.Duration(exec * float64(time.Millisecond))
			c.planTime = time.Duration(plan * float64(time.Millisecond))
			c.query = statementStart(c.query)
			out = append(out, c)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("-statements: %w", err)
	}
	return out, nil
}

// statementsSchema is the schema of the pg_stat_statements extension, as
// an identifier: the URL's search_path need not hold it.
func statementsSchema(ctx context.Context, conn *pgx.Conn) (string, error) {
	var schema string
	err := conn.QueryRow(ctx, `SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_stat_statements'`).Scan(&schema)
	if err != nil {
		return "", fmt.Errorf("find the pg_stat_statements extension: %w", err)
	}
	return schema, nil
}

var spaces = regexp.MustCompile(`\s+`)

// statementStart is the start of a statement's text on one line.
func statementStart(q string) string {
	q = strings.TrimSpace(spaces.ReplaceAllString(q, " "))
	if len(q) > 60 {
		q = q[:60] + "…"
	}
	return q
}

// printStatements lists r's statements per send, under its row.
func printStatements(out io.Writer, r fleetResult) {
	if len(r.statements) == 0 || r.sends == 0 {
		return
	}
	n := float64(r.sends)
	fmt.Fprintf(out, "       %9s %10s %10s %12s %12s %9s %12s  %s\n", "calls/send", "exec/send", "plan/send", "buffers/send", "wal_recs/send", "fpi/send", "wal_B/send", "statement")
	for _, c := range r.statements {
		fmt.Fprintf(out, "       %9.2f %10s %10s %12.1f %12.1f %9.2f %12.0f  %s\n", float64(c.calls)/n,
			(c.execTime / time.Duration(r.sends)).Round(100*time.Nanosecond), (c.planTime / time.Duration(r.sends)).Round(100*time.Nanosecond),
			float64(c.buffersHit)/n, float64(c.walRecords)/n, float64(c.walFPI)/n, c.walBytes/n, c.query)
	}
}

// withConn runs f on a connection of its own to databaseURL, within a
// minute.
func withConn(ctx context.Context, databaseURL string, f func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return f(ctx, conn)
}
