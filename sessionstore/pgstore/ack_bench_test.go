package pgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// BenchmarkAck measures one recipient's ack of its newest signal after a
// history of acknowledged signals that no VACUUM removed, the way an
// attached client acks each signal (docs/benchmarks-history.md, "The ack's
// scan bounded below"):
//
//	go test ./sessionstore/pgstore -run '^$' -bench Ack -benchtime 300x
//
// snapshot=held keeps a transaction's snapshot open from before the
// history, as a long transaction or a lagging autovacuum would: no dead
// tuple can be removed or its index entry killed. The store's connections
// commit with synchronous_commit off, so the figure is the statements' cost,
// not the WAL flush. Each iteration appends a signal (not timed) and acks
// it; ack_p50_us and ack_p99_us are the ack's latency.
func BenchmarkAck(b *testing.B) {
	for _, held := range []bool{false, true} {
		for _, history := range []int{0, 1000, 10000} {
			name := fmt.Sprintf("snapshot=%s/history=%d", map[bool]string{false: "none", true: "held"}[held], history)
			b.Run(name, func(b *testing.B) { benchAck(b, history, held) })
		}
	}
}

func benchAck(b *testing.B, history int, held bool) {
	u := pgtest.Schema(b)
	ctx := context.Background()
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	st, err := pgstore.Open(ctx, u+sep+"synchronous_commit=off", pgstore.WithMaxConns(4))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	k := sessionstore.Key{TenantID: "t", ProjectID: "p", SessionID: "bob"}
	if _, err := st.CreateSession(ctx, sessionstore.Session{Key: k, TokenHash: []byte(uuid.NewString()),
		RegisteredAt: now, ExpiresAt: now.Add(time.Hour)}, now); err != nil {
		b.Fatal(err)
	}
	if held {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // read only
		if _, err := tx.Exec(ctx, `SELECT count(*) FROM sessions`); err != nil {
			b.Fatal(err)
		}
	}
	payload := json.RawMessage(`"` + "012345678901234567890123456789012345678901234567890123456" + `"`)
	var seq int64
	appendOne := func() {
		_, _, err := st.AppendSignal(ctx, sessionstore.NewSignal{ID: uuid.NewString(), To: k, FromSession: "s",
			Kind: "bench", Payload: payload, CreatedAt: now,
			Limits: sessionstore.Limits{PendingPerRecipient: 1 << 30, PendingBytesPerProject: 1 << 40}}, now)
		if err != nil {
			b.Fatal(err)
		}
		seq++
	}
	// The history, acknowledged 100 signals at a time: each stays in the
	// primary key all the same.
	for seq < int64(history) {
		appendOne()
		if seq%100 == 0 || seq == int64(history) {
			if _, err := st.AckSignals(ctx, k, seq, now); err != nil {
				b.Fatal(err)
			}
		}
	}
	lats := make([]time.Duration, 0, b.N)
	for b.Loop() {
		b.StopTimer()
		appendOne()
		b.StartTimer()
		t0 := time.Now()
		n, err := st.AckSignals(ctx, k, seq, now)
		lats = append(lats, time.Since(t0))
		if err != nil || n != 1 {
			b.Fatalf("ack of seq %d: %d acknowledged, %v; want 1", seq, n, err)
		}
	}
	slices.Sort(lats)
	b.ReportMetric(float64(lats[len(lats)/2].Nanoseconds())/1000, "ack_p50_us")
	b.ReportMetric(float64(lats[len(lats)*99/100].Nanoseconds())/1000, "ack_p99_us")
}
