// Package migrations holds the Postgres schema of the durable store as
// golang-migrate SQL files, embedded in the binary, and applies them.
//
// Up, Down, Steps and Version take the database as a postgres:// URL or a
// keyword/value string (host=… dbname=…), as pgx reads them.
//
// `marconi migrate` and the hub at start call Up; pgstore assumes the schema
// is at the latest version, and the hub's /readyz compares the schema's
// version with Latest. Before `marconi migrate down` reverts anything, each
// step's Drops says what its down SQL removes. Every table lives in the
// schema named first in the connection's search_path (and so does
// golang-migrate's own schema_migrations table), which is how tests give each
// test its own schema.
package migrations
