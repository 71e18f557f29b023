package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgcluster"
	"github.com/marconihub/marconi/migrations"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// TestReadOnlyServerIsUnavailable, against a real standby: a store that
// reaches a standby (a URL naming it alone) answers a write, and a ping,
// with ErrUnavailable, not an internal error or a success, and names the
// cause as read-only;
// on the multi-host URL with target_session_attrs=read-write, while the
// primary is down and the standby not yet promoted, every call is
// ErrUnavailable ("no read-write server"); once the standby is promoted the
// same store, without being reopened, writes there and reads what was
// committed before the crash.
func TestReadOnlyServerIsUnavailable(t *testing.T) {
	c := pgcluster.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, c.Primary().URL()); err != nil {
		t.Fatal(err)
	}
	open := func(url string) *pgstore.Store {
		st, err := pgstore.Open(ctx, url, pgstore.WithQueryTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	session := func(id string) sessionstore.Session {
		return sessionstore.Session{
			Key:     sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: id},
			Surface: "cli", RuntimeMode: "stateless", RuntimeModeSource: "default", ClientID: "c-" + id,
			TokenHash: []byte("token hash of " + id), RegisteredAt: now, ExpiresAt: now.Add(time.Hour),
		}
	}
	multi := open(c.URL())
	if _, err := multi.CreateSession(ctx, session("before"), now); err != nil {
		t.Fatalf("create on the primary: %v", err)
	}

	standby := open(c.Standby().URL())
	_, err := standby.CreateSession(ctx, session("on-standby"), now)
	if !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("a write on the standby: %v, want ErrUnavailable", err)
	}
	if class := standby.Classify(err); !strings.Contains(class, "read-only") {
		t.Errorf("a write on the standby is classed %q; want it named read-only", class)
	}
	t.Logf("a write on the standby: %s", standby.Diagnose(err))
	for name, ping := range map[string]func(context.Context) error{"Ping": standby.Ping, "Reachable": standby.Reachable} {
		err := ping(ctx)
		if !errors.Is(err, sessionstore.ErrUnavailable) || !strings.Contains(standby.Classify(err), "read-only") {
			t.Errorf("%s on the standby: %v (classed %q), want ErrUnavailable, read-only", name, err, standby.Classify(err))
		}
	}

	// The pooled connections die with the primary: the first calls fail on
	// them (connection closed); new ones find only the standby.
	c.CrashPrimary()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err = multi.Ping(ctx)
		if !errors.Is(err, sessionstore.ErrUnavailable) {
			t.Fatalf("ping with only the standby up: %v, want ErrUnavailable", err)
		}
		if strings.Contains(multi.Classify(err), "no read-write server") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with only the standby up the cause stays classed %q; want no read-write server", multi.Classify(err))
		}
		time.Sleep(20 * time.Millisecond) // poll interval, not a wait for an event
	}
	t.Logf("with only the standby up: %s", multi.Diagnose(err))
	if _, err := multi.CreateSession(ctx, session("during"), now); !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("a write with only the standby up: %v, want ErrUnavailable", err)
	}

	c.Promote()
	if _, err := multi.CreateSession(ctx, session("after"), now); err != nil {
		t.Fatalf("a write after the promotion, same store: %v", err)
	}
	if _, err := multi.GetSession(ctx, session("before").Key, now); err != nil {
		t.Fatalf("the session committed before the crash, read on the promoted standby: %v", err)
	}
}
