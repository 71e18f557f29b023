package signals_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/signals"
	"github.com/marconihub/marconi/signals/selfheal"
)

// failingPending fails every pending read with err, first calling leave
// (the client going away while the read runs) when it is set.
type failingPending struct {
	*memstore.Store
	err   error
	leave func()
}

func (s *failingPending) PendingSignals(ctx context.Context, _ sessionstore.Key, _ int64, _ int) ([]sessionstore.Signal, error) {
	if s.leave != nil {
		s.leave()
		return nil, ctx.Err()
	}
	return nil, s.err
}

// TestPiggybackWarnsOnlyWhenTheClientStayed: a piggyback read that fails
// is a warning, unless the sender's request ended meanwhile (its client
// left): that is no fault of the hub's, and a fleet's clients closing would
// otherwise log one warning per send in flight.
func TestPiggybackWarnsOnlyWhenTheClientStayed(t *testing.T) {
	for _, tt := range []struct {
		name  string
		leave bool
		warn  bool
	}{
		{"the store fails", false, true},
		{"the client left", true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			store := &failingPending{Store: memstore.New(), err: errors.New("store down")}
			if tt.leave {
				store.leave = cancel
			}
			clock := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			now := func() time.Time { return clock }
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			sh, err := selfheal.New(selfheal.Config{}.WithDefaults(marconi.Development), now, prometheus.NewRegistry(), nil)
			if err != nil {
				t.Fatal(err)
			}
			svc, err := signals.New(signals.Config{}, store, rowRouter{}, sh, now, prometheus.NewRegistry(), log)
			if err != nil {
				t.Fatal(err)
			}
			w := &recipientWorld{t: t, store: &readCounting{Store: store.Store}, clock: clock}
			sender := w.register("alice", clock)
			w.register("bob", clock)
			if _, err := svc.Send(ctx, signals.SendRequest{Sender: sender, To: "bob"}); err != nil {
				t.Fatalf("send: %v (a failed piggyback read must not fail the send)", err)
			}
			if got := strings.Contains(logs.String(), "level=WARN"); got != tt.warn {
				t.Errorf("warned %v, want %v: %q", got, tt.warn, logs.String())
			}
		})
	}
}
