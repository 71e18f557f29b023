package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// TestKill9LosesNoAnsweredSend builds the hub, runs it as a process of its
// own on Postgres, has concurrent senders send through it (so group commits
// are in flight) and kills it with SIGKILL in the middle: every send it
// answered 200 must be in the store with the seq it answered, and each
// recipient's seqs must be 1..n without a gap.
func TestKill9LosesNoAnsweredSend(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (builds the binary and kills it): skipped by -short")
	}
	dbURL := pgtest.Schema(t)
	bin := filepath.Join(t.TempDir(), "marconi")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	const apiKey = "mak_kill9_test_local_only"
	var logs bytes.Buffer
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "MARCONI_ADDR="+addr, "MARCONI_DATABASE_URL="+dbURL,
		"MARCONI_API_KEYS="+apiKey+"=t1/p1", "MARCONI_ADMIN_TOKEN=madm_kill9_test_local_only",
		"MARCONI_MODE=development", "MARCONI_SELFHEAL=off", "MARCONI_LOG_LEVEL=error",
		"MARCONI_SEND_RATE_PER_SECOND=100000", "MARCONI_INSTANCE_ID=kill9")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	base := "http://" + addr
	client := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if resp, err := client.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("hub not ready within a minute; its output:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond) // polling the process's readiness, with a deadline
	}

	post := func(cred, path string, body any) (int, map[string]any, error) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+cred)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		var out map[string]any
		err = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out, err
	}
	register := func(id string) string {
		st, r, err := post(apiKey, "/v1/sessions", map[string]any{"session_id": id, "surface": "headless_cc"})
		if err != nil || st != http.StatusCreated {
			t.Fatalf("register %s: %d %v %v", id, st, r, err)
		}
		return r["token"].(string)
	}
	const recipients, senders = 4, 16
	for i := range recipients {
		register(fmt.Sprintf("r%d", i))
	}
	tokens := make([]string, senders)
	for i := range tokens {
		tokens[i] = register(fmt.Sprintf("s%d", i))
	}

	type answer struct {
		to  string
		seq int64
		id  string
	}
	var (
		mu       sync.Mutex
		answered []answer
		count    atomic.Int64
		wg       sync.WaitGroup
	)
	for i, tok := range tokens {
		wg.Go(func() {
			for n := 0; ; n++ {
				to := fmt.Sprintf("r%d", (i+n)%recipients)
				st, r, err := post(tok, "/v1/signals", map[string]any{"to_session": to, "payload": map[string]int{"s": i, "n": n}})
				if err != nil {
					return // the hub is gone
				}
				if st != http.StatusOK {
					continue
				}
				mu.Lock()
				answered = append(answered, answer{to, int64(r["seq"].(float64)), r["signal_id"].(string)})
				mu.Unlock()
				count.Add(1)
			}
		})
	}
	// Kill it once a few hundred sends were answered, senders still going.
	for count.Load() < 300 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d sends answered within the deadline", count.Load())
		}
		time.Sleep(time.Millisecond) // polling the senders' progress, with a deadline
	}
	if err := cmd.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	<-exited
	wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := pgstore.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	stored := map[string]sessionstore.Signal{}
	for i := range recipients {
		k := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: fmt.Sprintf("r%d", i)}
		sigs, err := st.PendingSignals(ctx, k, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for j, s := range sigs {
			if s.Seq != int64(j+1) {
				t.Fatalf("%s: stored seqs have a gap: position %d holds seq %d", k.SessionID, j+1, s.Seq)
			}
			stored[s.ID] = s
		}
	}
	for _, a := range answered {
		s, ok := stored[a.id]
		if !ok {
			t.Fatalf("send %s to %s was answered 200 (seq %d) but is not in the store after kill -9", a.id, a.to, a.seq)
		}
		if s.Seq != a.seq || s.To.SessionID != a.to {
			t.Fatalf("send %s answered seq %d to %s; the store has seq %d to %s", a.id, a.seq, a.to, s.Seq, s.To.SessionID)
		}
	}
	t.Logf("%d sends answered before the kill, %d stored", len(answered), len(stored))
}
