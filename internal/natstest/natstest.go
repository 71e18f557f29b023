// Package natstest gives tests the NATS server they may use, as pgtest
// gives them Postgres: without one they skip with one clear line, and CI
// (MARCONI_TEST_REQUIRE_NATS=1) turns that skip into a failure.
package natstest

import (
	"os"
	"testing"
)

// Environment variables read by this package.
const (
	// EnvURL names the NATS server the tests may use (nats://host:port).
	EnvURL = "MARCONI_TEST_NATS_URL"
	// EnvRequire, set to 1, turns a missing EnvURL into a failure.
	EnvRequire = "MARCONI_TEST_REQUIRE_NATS"
)

// URL returns MARCONI_TEST_NATS_URL. Without it the test is skipped, or
// fails when MARCONI_TEST_REQUIRE_NATS=1.
func URL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s is not set and %s=1: NATS tests must run", EnvURL, EnvRequire)
	}
	t.Skipf("skipping NATS test: %s is not set", EnvURL)
	return ""
}
