// Package pgtest gives tests that need the real Postgres a schema of their
// own, so that they can run in parallel without seeing each other's rows.
//
// The database is named by MARCONI_TEST_DATABASE_URL. Without it the tests
// skip with one clear line; with MARCONI_TEST_REQUIRE_POSTGRES=1 they fail
// instead (CI sets both).
package pgtest
