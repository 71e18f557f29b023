package pgstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
)

// The wake-ups of one batch reach each target instance in one NOTIFY (more
// only when they overflow a payload), and every session is woken. These
// tests build the batch themselves: through Publish, which sessions share a
// batch depends on timing.

// notifyCounter LISTENs on instance's channel on a connection of its own and
// returns the payloads it heard up to and including the first that wakes
// sentinel.
type notifyCounter struct {
	conn *pgx.Conn
}

func listenRaw(t *testing.T, s *Store, u, instance string) *notifyCounter {
	t.Helper()
	ctx := context.Background()
	ch, err := NewBus(s, nil).Channel(ctx, instance)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return &notifyCounter{conn: conn}
}

func (c *notifyCounter) until(t *testing.T, sentinel sessionstore.Key) (payloads []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		n, err := c.conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("after %d notifications, waiting for the sentinel: %v", len(payloads), err)
		}
		wakes, err := DecodeWakes(n.Payload)
		if err != nil {
			t.Fatalf("the listener could not decode %.80q: %v", n.Payload, err)
		}
		if len(wakes) == 1 && wakes[0].Key == sentinel {
			return payloads
		}
		payloads = append(payloads, n.Payload)
	}
}

// woken runs the bus's own listener for instance and records the highest seq
// it heard per session.
type woken struct {
	mu      sync.Mutex
	seqs    map[sessionstore.Key]int64
	changed chan struct{} // a wake-up arrived
}

func listenBus(t *testing.T, s *Store, instance string) *woken {
	t.Helper()
	w := &woken{seqs: map[sessionstore.Key]int64{}, changed: make(chan struct{}, 1)}
	connected := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		err := NewBus(s, nil).Listen(ctx, instance, time.Time{}, func(wk Wake) {
			w.mu.Lock()
			w.seqs[wk.Key] = max(w.seqs[wk.Key], wk.Seq)
			w.mu.Unlock()
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}, func() {
			select {
			case connected <- struct{}{}:
			default:
			}
		})
		if err != nil {
			t.Errorf("Listen: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-connected:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener never connected")
	}
	return w
}

// waitFor waits until every key in want was woken with its seq.
func (w *woken) waitFor(t *testing.T, want map[sessionstore.Key]int64) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		missing := 0
		for k, seq := range want {
			if w.seqs[k] != seq {
				missing++
			}
		}
		w.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-w.changed:
		case <-deadline.C:
			t.Fatalf("%d of %d sessions not woken with their seq", missing, len(want))
		}
	}
}

// runWakes runs one batch of wake-ups and fails on its error.
func runWakes(t *testing.T, s *Store, reqs []*wakeReq) {
	t.Helper()
	batch := make([]*appendReq, len(reqs))
	for i, w := range reqs {
		batch[i] = &appendReq{wake: w}
	}
	NewBus(s, nil).runWakes(0, batch)
	for _, r := range batch {
		if r.out.err != nil {
			t.Fatalf("batch of %d wake-ups: %v", len(batch), r.out.err)
		}
	}
}

func openWakeStore(t *testing.T) (*Store, string) {
	t.Helper()
	u := pgtest.Schema(t)
	s, err := Open(context.Background(), u, WithMaxConns(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, u
}

func TestBatchWakesOneNotifyPerInstance(t *testing.T) {
	t.Parallel()
	s, u := openWakeStore(t)
	rawB, rawC := listenRaw(t, s, u, "b"), listenRaw(t, s, u, "c")
	busB, busC := listenBus(t, s, "b"), listenBus(t, s, "c")

	wantB, wantC := map[sessionstore.Key]int64{}, map[sessionstore.Key]int64{}
	var reqs []*wakeReq
	for i := range 100 {
		k := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: fmt.Sprintf("agent-%03d", i)}
		reqs = append(reqs, &wakeReq{instance: "b", w: Wake{Key: k, Seq: 7}})
		wantB[k] = 7
		if i%10 == 0 { // a second, older wake-up of the same session, and one for c
			reqs = append(reqs, &wakeReq{instance: "b", w: Wake{Key: k, Seq: 3}})
			reqs = append(reqs, &wakeReq{instance: "c", w: Wake{Key: k, Seq: 9}})
			wantC[k] = 9
		}
	}
	runWakes(t, s, reqs)
	sentinel := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "sentinel"}
	runWakes(t, s, []*wakeReq{{instance: "b", w: Wake{Key: sentinel, Seq: 1}}, {instance: "c", w: Wake{Key: sentinel, Seq: 1}}})

	// A later transaction's notifications arrive after an earlier one's:
	// what came before the sentinel is all the batch sent.
	if ps := rawB.until(t, sentinel); len(ps) != 1 {
		t.Fatalf("b heard %d NOTIFYs for one batch of wake-ups, want 1", len(ps))
	}
	if ps := rawC.until(t, sentinel); len(ps) != 1 {
		t.Fatalf("c heard %d NOTIFYs for one batch of wake-ups, want 1", len(ps))
	}
	busB.waitFor(t, wantB)
	busC.waitFor(t, wantC)
}

func TestBatchWakesSplitBeyondOnePayload(t *testing.T) {
	t.Parallel()
	s, u := openWakeStore(t)
	raw := listenRaw(t, s, u, "b")
	bus := listenBus(t, s, "b")

	// Long session ids (about 270 bytes a wake-up) overflow the byte bound
	// well before the entry bound.
	const n = 200
	want := map[sessionstore.Key]int64{}
	var reqs []*wakeReq
	for i := range n {
		k := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: fmt.Sprintf("%03d-%s", i, strings.Repeat("x", 200))}
		reqs = append(reqs, &wakeReq{instance: "b", w: Wake{Key: k, Seq: int64(i + 1)}})
		want[k] = int64(i + 1)
	}
	runWakes(t, s, reqs)
	sentinel := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "sentinel"}
	runWakes(t, s, []*wakeReq{{instance: "b", w: Wake{Key: sentinel, Seq: 1}}})

	ps := raw.until(t, sentinel)
	size := 0
	for _, p := range ps {
		if len(p) > MaxWakeBatchPayload {
			t.Fatalf("a NOTIFY of %d bytes, over %d", len(p), MaxWakeBatchPayload)
		}
		size += len(p)
	}
	// As few as fit: one more than the bytes could have filled at most.
	if least := size/MaxWakeBatchPayload + 1; len(ps) < 2 || len(ps) > least+1 {
		t.Fatalf("%d NOTIFYs carrying %d bytes of wake-ups, want between 2 and %d", len(ps), size, least+1)
	}
	bus.waitFor(t, want)
}
