package hub_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/testlog"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/breaker"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// unreachableTokens times out every token lookup, as a partitioned store.
type unreachableTokens struct{ sessionstore.Store }

func (unreachableTokens) SessionByToken(context.Context, []byte, time.Time) (sessionstore.Session, error) {
	return sessionstore.Session{}, fmt.Errorf("lookup: %w: %w", sessionstore.ErrUnavailable, context.DeadlineExceeded)
}

// TestOpenBreakerIsNotALogFlood: in an outage every refused call still
// answers 503 registry_unavailable and counts, but only the call that found
// the store unreachable logs a warning; the ones the open breaker refused at
// once log at debug.
func TestOpenBreakerIsNotALogFlood(t *testing.T) {
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	br, err := breaker.New(unreachableTokens{memstore.New()}, breaker.Config{}, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	h := hubtest.Start(t, hubtest.Options{Store: br, Logger: log})
	for i := range 5 {
		if st, r := call(t, "POST", h.URL+"/v1/heartbeat", "mst_whatever", nil); st != 503 || errCode(r) != "registry_unavailable" {
			t.Fatalf("call %d in the outage: %d %v", i, st, r)
		}
	}
	if got := metric(t, h, "marconi_registry_errors_total"); got != 5 {
		t.Fatalf("marconi_registry_errors_total = %v, want 5", got)
	}
	if n := strings.Count(logs.String(), `level=WARN msg="store unavailable"`); n != 1 {
		t.Fatalf("%d warnings of the outage, want 1 (the rest at debug):\n%s", n, logs.String())
	}
}
