package bootstrap

import (
	"errors"
	"testing"

	"go.uber.org/goleak"
)

// Every test of the package (the integration tests included) must leave no
// goroutine behind: the client owns all it starts.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }
