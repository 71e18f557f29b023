package pgstore_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every store closed all its goroutines (pool health
// checks, pgx's async closes, the test proxies).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
