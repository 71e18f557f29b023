// Package pgcluster builds, for a test, a real replicated Postgres on
// loopback: a primary and a synchronous streaming standby made with Debian's
// PostgreSQL tools (initdb, pg_basebackup -R, pg_ctl) under the postgres OS
// user, each on a free port with its data directory in a temporary
// directory removed when the test ends. Helpers crash the primary
// (pg_ctl stop -m immediate), promote the standby and rebuild the old
// primary as the new primary's standby, so tests can run the failovers and
// switchovers an operator's database goes through.
//
// Without the tools the tests skip with one line; with
// MARCONI_TEST_REQUIRE_FAILOVER=1 they fail instead (CI sets it). Under
// -short they skip.
package pgcluster
