package pgstore_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testproxy"
	"github.com/marconihub/marconi/internal/testwait"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// proxiedStore opens a Store on a fresh schema whose connections all go
// through a testproxy.
func proxiedStore(t *testing.T, opts ...pgstore.Option) (*pgstore.Store, *testproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	p := testproxy.Start(t, u.Host)
	u.Host = p.Addr()
	s, err := pgstore.Open(context.Background(), u.String(), opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	// Cleanups run last-registered first: the proxy closes before the
	// store, so that Close does not wait on pgx draining a frozen
	// connection (up to 15 s).
	t.Cleanup(p.Close)
	return s, p
}

// within3s runs f with a context that has a 3 s deadline.
func within3s(f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return f(ctx)
}

// eventually polls f until it returns nil, failing t after 15 s.
func eventually(t *testing.T, what string, f func(ctx context.Context) error) {
	t.Helper()
	testwait.ForNil(t, what+" to recover", 15*time.Second, func() error {
		err := within3s(f)
		if err != nil {
			t.Logf("%s: %v", what, err)
		}
		return err
	})
}

func createOne(t *testing.T, s *pgstore.Store) (sessionstore.Key, time.Time) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Microsecond)
	k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "alice"}
	_, err := s.CreateSession(context.Background(), sessionstore.Session{
		Key: k, TokenHash: []byte("hash"), RegisteredAt: now, ExpiresAt: now.Add(time.Hour),
	}, now)
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	return k, now
}

func TestFailsClosedWhenCutAndRecovers(t *testing.T) {
	t.Parallel()
	s, p := proxiedStore(t)
	k, now := createOne(t, s)

	p.Cut()
	if err := within3s(s.Ping); !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("Ping while cut: err = %v, want ErrUnavailable", err)
	}
	err := within3s(func(ctx context.Context) error { _, err := s.GetSession(ctx, k, now); return err })
	if !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("GetSession while cut: err = %v, want ErrUnavailable", err)
	}
	_, _, err = s.AppendSignal(context.Background(), sessionstore.NewSignal{ID: "x", To: k, CreatedAt: now}, now)
	if !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("AppendSignal while cut: err = %v, want ErrUnavailable", err)
	}

	p.Restore()
	eventually(t, "Ping", s.Ping)
	eventually(t, "GetSession", func(ctx context.Context) error {
		got, err := s.GetSession(ctx, k, now)
		if err == nil && got.SessionID != k.SessionID {
			t.Fatalf("GetSession after restore = %+v", got)
		}
		return err
	})
}

// TestWitnessSeesACutAndTheRecovery: the store's statements, through the
// pgx tracer, count a cut as failures and withdraw the last write; a write
// once Postgres is back counts again. No statement is spent to say so.
func TestWitnessSeesACutAndTheRecovery(t *testing.T) {
	t.Parallel()
	s, p := proxiedStore(t)
	if since, failures := s.Witness(); since >= 0 || failures != 0 {
		t.Fatalf("a new store: since %v, failures %d; want no write, no failure", since, failures)
	}
	k, now := createOne(t, s)
	if since, failures := s.Witness(); since < 0 || failures != 0 {
		t.Fatalf("after a registration: since %v, failures %d; want a write, no failure", since, failures)
	}
	p.Cut()
	if _, err := s.GetSession(context.Background(), k, now); !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("GetSession while cut: %v, want ErrUnavailable", err)
	}
	if since, failures := s.Witness(); since >= 0 || failures == 0 {
		t.Fatalf("after a call met the cut: since %v, failures %d; want no write, a failure", since, failures)
	}
	p.Restore()
	eventually(t, "a write after the cut", func(ctx context.Context) error {
		return s.TouchSession(ctx, k, sessionstore.Touch{SeenAt: now, ExpiresAt: now.Add(time.Hour)}, now)
	})
	if since, _ := s.Witness(); since < 0 {
		t.Fatalf("after a write once Postgres is back: since %v, want a write", since)
	}
}

func TestFailsClosedWhenFrozenAndRecovers(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (waits out store timeouts): skipped by -short")
	}
	t.Parallel()
	// createOne leaves exactly one idle connection, so the call after
	// Freeze must use it. The second slot lets the store recover at once:
	// pgx holds a dead connection's slot for up to 15 s while it drains it.
	s, p := proxiedStore(t, pgstore.WithMaxConns(2))
	k, now := createOne(t, s)

	p.Freeze()
	err := within3s(func(ctx context.Context) error { _, err := s.GetSession(ctx, k, now); return err })
	if !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("GetSession on a half-open connection: err = %v, want ErrUnavailable", err)
	}
	// New connections pass: the store finds a working one by itself.
	eventually(t, "GetSession", func(ctx context.Context) error { _, err := s.GetSession(ctx, k, now); return err })
}

func TestStartsWhilePostgresIsDown(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	p := testproxy.Start(t, u.Host)
	p.Cut()
	u.Host = p.Addr()
	s, err := pgstore.Open(context.Background(), u.String())
	if err != nil {
		t.Fatalf("Open while Postgres is unreachable: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := within3s(s.Ping); !errors.Is(err, sessionstore.ErrUnavailable) {
		t.Fatalf("Ping while unreachable: err = %v, want ErrUnavailable", err)
	}
	p.Restore()
	eventually(t, "Ping", s.Ping)
}
