package pgstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func pingCause(t *testing.T, url string) string {
	t.Helper()
	st, err := pgstore.Open(context.Background(), url, pgstore.WithQueryTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	err = st.Ping(context.Background())
	if err == nil {
		t.Fatalf("ping %s succeeded", url)
	}
	return st.Diagnose(err)
}

// TestDiagnoseNamesTheCause: what an operator reads when Postgres cannot be
// used names the real cause, never a password.
func TestDiagnoseNamesTheCause(t *testing.T) {
	addr := closedAddr(t)
	if got, want := pingCause(t, "postgres://u:secret-pw@"+addr+"/db?sslmode=disable"), "connection refused at "+addr; got != want {
		t.Errorf("closed port: %q, want %q", got, want)
	}
	if pgstore.Diagnose(nil) != "" {
		t.Error("Diagnose(nil) is not empty")
	}
	base := pgtest.DatabaseURL(t)
	for _, tt := range []struct{ url, want string }{
		{strings.Replace(base, "postgres://postgres@", "postgres://no_such_role_diag:secret-pw@", 1), `authentication failed for user "no_such_role_diag" at `},
		{regexp.MustCompile(`/[^/?]+(\?|$)`).ReplaceAllString(base, "/no_such_db_diag$1"), `database "no_such_db_diag" does not exist at `},
	} {
		got := pingCause(t, tt.url)
		if !strings.HasPrefix(got, tt.want) || strings.Contains(got, "secret-pw") {
			t.Errorf("%s: %q, want it to start with %q", tt.url, got, tt.want)
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger's writes and the test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestListenerNeverConnectedSaysSo: a wake-up listener that never had a
// connection says it cannot connect, and why; it does not claim to have lost
// one.
func TestListenerNeverConnectedSaysSo(t *testing.T) {
	addr := closedAddr(t)
	st, err := pgstore.Open(context.Background(), "postgres://u@"+addr+"/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var logs lockedBuffer
	bus := pgstore.NewBus(st, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bus.Listen(ctx, "i1", nil, func() {}) }()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(logs.String(), "cannot connect") < 2 {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no 'cannot connect' twice in the log:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	text := logs.String()
	if strings.Contains(text, "lost its connection") || !strings.Contains(text, "connection refused at "+addr) {
		t.Errorf("listener log:\n%s", text)
	}
}
