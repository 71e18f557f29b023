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

// refusedTokens refuses every token lookup, as a store that is gone.
type refusedTokens struct{ sessionstore.Store }

func (refusedTokens) SessionByToken(context.Context, []byte, time.Time) (sessionstore.Session, error) {
	return sessionstore.Session{}, fmt.Errorf("lookup: %w: connection refused", sessionstore.ErrUnavailable)
}

// TestReadyzFollowsReachabilityNotTheBreaker: a store call out of time opens
// the breaker (calls still answer 503 at once) but /readyz stays 200 while
// the store answers its probe: every instance shares a slow store, and a
// balancer with no server helps nobody. A refused call, the store gone,
// fails /readyz at once. (The breaker's probe loop is not running here, so
// the open breaker is what /readyz sees.)
func TestReadyzFollowsReachabilityNotTheBreaker(t *testing.T) {
	for _, tt := range []struct {
		name  string
		store sessionstore.Store
		ready int
	}{
		{"slow", unreachableTokens{memstore.New()}, 200},
		{"gone", refusedTokens{memstore.New()}, 503},
	} {
		t.Run(tt.name, func(t *testing.T) {
			br, err := breaker.New(tt.store, breaker.Config{}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			h := hubtest.Start(t, hubtest.Options{Store: br})
			for i := range 2 {
				if st, r := call(t, "POST", h.URL+"/v1/heartbeat", "mst_whatever", nil); st != 503 || errCode(r) != "registry_unavailable" {
					t.Fatalf("call %d: %d %v, want 503 registry_unavailable", i, st, r)
				}
			}
			if !br.Open() {
				t.Fatal("the breaker did not open")
			}
			if st, r := call(t, "GET", h.URL+"/readyz", "", nil); st != tt.ready {
				t.Fatalf("/readyz with the breaker open on a %s store: %d %v, want %d", tt.name, st, r, tt.ready)
			}
		})
	}
}

// privateCause is a store whose ping is refused and that diagnoses the
// refusal with the database's address, as pgstore does.
type privateCause struct{ sessionstore.Store }

func (privateCause) Ping(context.Context) error {
	return fmt.Errorf("ping: %w: connection refused", sessionstore.ErrUnavailable)
}
func (privateCause) Diagnose(error) string { return "connection refused at db.internal:5432" }
func (privateCause) Classify(error) string { return "connection refused" }

// TestReadyzNamesTheAddressOnlyToTheAdmin: anyone reads the class of a
// store failure in /readyz; only a request carrying the admin token reads
// where the database is.
func TestReadyzNamesTheAddressOnlyToTheAdmin(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Store: privateCause{memstore.New()}})
	for _, cred := range []string{"", "mst_whatever", "madm_not-the-admin-token"} {
		st, r := call(t, "GET", h.URL+"/readyz", cred, nil)
		if msg := errMessage(r); st != 503 || !strings.Contains(msg, "(connection refused)") || strings.Contains(msg, "db.internal") {
			t.Errorf("/readyz with credential %q: %d %q; want the class without the address", cred, st, msg)
		}
	}
	if st, r := call(t, "GET", h.URL+"/readyz", h.AdminToken, nil); st != 503 || !strings.Contains(errMessage(r), "(connection refused at db.internal:5432)") {
		t.Errorf("/readyz with the admin token: %d %v; want the full cause", st, r)
	}
}

func errMessage(r map[string]any) string {
	e, _ := r["error"].(map[string]any)
	m, _ := e["message"].(string)
	return m
}

// refusingCause is privateCause whose session lookups are refused too, as
// every call is in an outage.
type refusingCause struct{ privateCause }

func (refusingCause) SessionByToken(context.Context, []byte, time.Time) (sessionstore.Session, error) {
	return sessionstore.Session{}, fmt.Errorf("session by token: %w: connection refused", sessionstore.ErrUnavailable)
}

// TestUnavailableNamesTheClassNotTheAddress: a call that the store could not
// serve answers 503 registry_unavailable naming the class of the failure,
// never where the database is.
func TestUnavailableNamesTheClassNotTheAddress(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Store: refusingCause{privateCause{memstore.New()}}})
	st, r := call(t, "POST", h.URL+"/v1/heartbeat", "mst_"+strings.Repeat("a", 43), nil)
	if msg := errMessage(r); st != 503 || errCode(r) != "registry_unavailable" || !strings.Contains(msg, "(connection refused)") || strings.Contains(msg, "db.internal") {
		t.Fatalf("heartbeat in an outage: %d %v; want 503 registry_unavailable naming the class, not the address", st, r)
	}
}
