package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/internal/testlog"
)

const attachKey, attachAdmin = "attach-key-0123456789abcdef", "attach-admin-0123456789abcdef"

// attachHub is the configuration of a hub for the attach tests (lan: the
// key and the admin token are the ones above).
func attachHub(db string) map[string]string {
	return map[string]string{
		"MARCONI_DATABASE_URL": db, "MARCONI_MODE": "lan",
		"MARCONI_API_KEYS": attachKey + "=t/p", "MARCONI_ADMIN_TOKEN": attachAdmin,
		"MARCONI_PUBLIC_URL": "http://hub.example",
	}
}

// attachRun is `marconi attach` running in-process: the frames it prints,
// one a line, and its exit code once it ends.
type attachRun struct {
	t      *testing.T
	lines  chan string
	code   chan int
	ended  bool
	exit   int
	stderr testlog.Buffer
	cancel context.CancelFunc // Ctrl-C
}

// startAttach runs `marconi attach base token` until the test ends.
func startAttach(t *testing.T, base, token string) *attachRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &attachRun{t: t, lines: make(chan string, 64), code: make(chan int, 1), cancel: cancel}
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(r.lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
	}()
	go func() {
		defer wg.Done()
		r.code <- run(ctx, []string{"attach", base, token}, env(nil), pw, &r.stderr)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		for range r.lines { // what nobody read, so the printer is not held up
		}
		wg.Wait()
	})
	return r
}

// signal waits for the printed signal of seq, skipping earlier ones (a
// signal pushed but not yet acknowledged when a connection ends comes
// again), and fails the test if attach ends first.
func (r *attachRun) signal(seq int) {
	r.t.Helper()
	for {
		f := r.frame("signal")
		switch got := f["seq"].(float64); {
		case got == float64(seq):
			return
		case got > float64(seq):
			r.t.Fatalf("signal %v printed while seq %d was awaited", f, seq)
		}
	}
}

// frame waits for the next printed frame of type typ, skipping others,
// and fails the test if attach ends first.
func (r *attachRun) frame(typ string) map[string]any {
	r.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-r.lines:
			if !ok { // attach ended and closed its stdout
				r.t.Fatalf("attach ended (exit %d) while a %s frame was awaited; stderr:\n%s", r.exitCode(), typ, r.stderr.String())
			}
			var f map[string]any
			if err := json.Unmarshal([]byte(line), &f); err != nil {
				r.t.Fatalf("attach printed %q, not a frame: %v", line, err)
			}
			if f["type"] == typ {
				return f
			}
		case code := <-r.code:
			r.ended, r.exit = true, code
			r.t.Fatalf("attach ended (exit %d) while a %s frame was awaited; stderr:\n%s", code, typ, r.stderr.String())
		case <-deadline:
			r.t.Fatalf("no %s frame within 30s; stderr:\n%s", typ, r.stderr.String())
		}
	}
}

// exitCode waits for attach to end and returns its exit code.
func (r *attachRun) exitCode() int {
	r.t.Helper()
	if r.ended {
		return r.exit
	}
	select {
	case r.exit = <-r.code:
		r.ended = true
		return r.exit
	case <-time.After(30 * time.Second):
		r.t.Fatalf("attach did not end within 30s; stderr:\n%s", r.stderr.String())
		return 0
	}
}

// attachSession registers id on m and returns its session token.
func attachSession(t *testing.T, m *Main, id string) string {
	t.Helper()
	st, reg := fabricCall(t, "POST", m.URL()+"/v1/sessions", attachKey, map[string]any{"session_id": id, "surface": "claude_code"})
	if st != http.StatusCreated {
		t.Fatalf("register %s: %d %v", id, st, reg)
	}
	return reg["token"].(string)
}

// sendTo sends a signal from the session of token to `to` through m.
func sendTo(t *testing.T, m *Main, token, to string, n int) {
	t.Helper()
	if st, r := fabricCall(t, "POST", m.URL()+"/v1/signals", token, map[string]any{"to_session": to, "payload": map[string]int{"n": n}}); st != http.StatusOK {
		t.Fatalf("send %d to %s: %d %v", n, to, st, r)
	}
}

// pendingOf is how many signals of session id wait unacknowledged on m.
func pendingOf(t *testing.T, m *Main, id string) float64 {
	t.Helper()
	st, r := fabricCall(t, "GET", m.URL()+"/v1/ops/sessions/t/p/"+id+"/signals", attachAdmin, nil)
	if st != http.StatusOK {
		t.Fatalf("signals of %s: %d %v", id, st, r)
	}
	return r["total"].(float64)
}

// TestAttachReconnectsAfterADisconnect: an operator's disconnect closes
// the WebSocket with 1012 ("reconnect"): attach comes back, prints and
// acks what follows, and ends only when the session ends (4410), with
// exit code 3.
func TestAttachReconnectsAfterADisconnect(t *testing.T) {
	m, _ := startMain(t, attachHub(""))
	alice, bob := attachSession(t, m, "alice"), attachSession(t, m, "bob")
	a := startAttach(t, m.URL(), bob)
	a.frame("welcome")
	sendTo(t, m, alice, "bob", 1)
	a.signal(1)

	if st, r := fabricCall(t, "POST", m.URL()+"/v1/ops/sessions/t/p/bob/disconnect", attachAdmin, nil); st != http.StatusOK || r["disconnected"] != true {
		t.Fatalf("disconnect bob: %d %v", st, r)
	}
	a.frame("welcome")
	sendTo(t, m, alice, "bob", 2)
	a.signal(2)
	pollUntil(t, "bob's signals acknowledged by attach", func() bool { return pendingOf(t, m, "bob") == 0 })

	if st, r := fabricCall(t, "DELETE", m.URL()+"/v1/ops/sessions/t/p/bob", attachAdmin, nil); st != http.StatusNoContent {
		t.Fatalf("delete bob: %d %v", st, r)
	}
	if code := a.exitCode(); code != exitSessionEnded || !strings.Contains(a.stderr.String(), "4410") {
		t.Fatalf("attach after the session ended: exit %d, stderr %q; want %d naming 4410", code, a.stderr.String(), exitSessionEnded)
	}
}

// TestAttachRidesARestart: a hub on Postgres drained by its shutdown (1012)
// and started again on the same address: attach reconnects through the
// refused connections of the gap, prints the signals sent meanwhile and
// after, and ends with exit code 0 on Ctrl-C.
func TestAttachRidesARestart(t *testing.T) {
	db := pgtest.Schema(t)
	first, _ := startMain(t, attachHub(db))
	alice, bob := attachSession(t, first, "alice"), attachSession(t, first, "bob")
	a := startAttach(t, first.URL(), bob)
	a.frame("welcome")
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	kv := attachHub(db)
	kv["MARCONI_ADDR"] = strings.TrimPrefix(first.URL(), "http://")
	again, _ := startMain(t, kv)
	sendTo(t, again, alice, "bob", 1)
	a.frame("welcome")
	a.signal(1)
	pollUntil(t, "bob's signal acknowledged by attach", func() bool { return pendingOf(t, again, "bob") == 0 })

	a.cancel()
	if code := a.exitCode(); code != 0 {
		t.Fatalf("attach after Ctrl-C: exit %d, stderr:\n%s", code, a.stderr.String())
	}
}
