package deploy_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The soak test starts goroutines (process waiters, agents, senders): each
// must end before the test does.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
