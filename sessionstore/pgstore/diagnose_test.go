package pgstore_test

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testlog"
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
	detail, _ := pingCauses(t, url)
	return detail
}

// pingCauses is Diagnose's and Classify's reading of a failed ping.
func pingCauses(t *testing.T, url string) (detail, class string) {
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
	return st.Diagnose(err), st.Classify(err)
}

// TestClassifyNamesNothingPrivate: the class of a failure, which anyone
// who can reach /readyz reads, names neither the database's address, nor
// its user, nor its name; Diagnose, for operators, names them.
func TestClassifyNamesNothingPrivate(t *testing.T) {
	addr := closedAddr(t)
	detail, class := pingCauses(t, "postgres://u:secret-pw@"+addr+"/db?sslmode=disable")
	if class != "connection refused" || detail != "connection refused at "+addr {
		t.Errorf("closed port: class %q, detail %q", class, detail)
	}
	if pgstore.Classify(nil) != "" {
		t.Error("Classify(nil) is not empty")
	}
	base := pgtest.DatabaseURL(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ url, class string }{
		{strings.Replace(base, "postgres://postgres@", "postgres://no_such_role_cls:secret-pw@", 1), "authentication failed"},
		{regexp.MustCompile(`/[^/?]+(\?|$)`).ReplaceAllString(base, "/no_such_db_cls$1"), "the database does not exist"},
	} {
		detail, class := pingCauses(t, tt.url)
		if class != tt.class {
			t.Errorf("%s: class %q, want %q (detail %q)", tt.url, class, tt.class, detail)
		}
		for _, private := range []string{u.Host, u.Hostname(), "no_such_role_cls", "no_such_db_cls", "secret-pw"} {
			if strings.Contains(class, private) {
				t.Errorf("class %q names %q", class, private)
			}
		}
	}
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
	var logs testlog.Buffer
	bus := pgstore.NewBus(st, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bus.Listen(ctx, "i1", time.Time{}, nil, func() {}) }()
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
