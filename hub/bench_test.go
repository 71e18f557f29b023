package hub_test

// Benchmarks of the hub's speed and memory, run by hand and recorded in
// docs/benchmarks.md. They run only with -bench; none of them is a Test, so
// `go test` without -bench compiles them and runs nothing slow.
//
// Every benchmark talks to a real hub (hubtest.Start) over loopback HTTP and
// WebSocket, on the in-memory store and, when MARCONI_TEST_DATABASE_URL is
// set, on Postgres (a schema of its own). The client side runs in the same
// process, so its CPU and memory are part of what is measured; each result
// says where that matters.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
	"github.com/marconihub/marconi/signals/selfheal"
)

// benchStores are the stores every store-bound benchmark runs on.
var benchStores = []string{"memstore", "postgres"}

// benchTimeout bounds every single request or frame of a benchmark.
const benchTimeout = 10 * time.Second

// benchHub starts a hub on the named store. The per-session send limit is
// lifted (a benchmark is one sender sending as fast as it can); everything
// else is the default configuration.
func benchHub(b *testing.B, store string) *hubtest.Hub {
	b.Helper()
	// The per-session send limit and the quotas are lifted: a benchmark's
	// one recipient collects every send it makes. So is the frame rate a
	// client may send (MARCONI_WS_FRAMES_PER_SECOND, 100 with a burst of
	// 200), as cmd/marconi-bench lifts it: a recipient acking every ackEvery
	// signals at some 16,000 sends a second sends about 250 acks a second,
	// spends the burst in about 1.3 s and is closed with 1008
	// quota_exceeded: frames_per_second, so every send after it answered
	// queued_offline (route_without_queue) and a run longer than that
	// failed. The hub did as documented; the benchmark measures sends, not
	// that quota.
	o := hubtest.Options{Config: hub.Config{SendRatePerSecond: 1e9, QuotaRegistrationsPerSecond: 1e9, WSFramesPerSecond: 1e9,
		StoreQuotas: sessionstore.Limits{PendingPerRecipient: 1 << 40, PendingBytesPerProject: 1 << 50}}}
	if store == "postgres" {
		u := pgtest.Schema(b)
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		st, err := pgstore.Open(ctx, u)
		if err != nil {
			b.Fatalf("open pgstore: %v", err)
		}
		b.Cleanup(func() { st.Close() })
		o.Store = st
	}
	return hubtest.Start(b, o)
}

// benchHTTP is one keep-alive HTTP client per benchmark, with enough idle
// connections for the parallel benchmarks not to redial.
func benchHTTP(b *testing.B) *http.Client {
	tr := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}
	b.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: benchTimeout}
}

// benchPost POSTs body with a bearer credential and returns status and answer.
func benchPost(hc *http.Client, url, cred string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}

// benchRegister registers session id (surface claude_code) and returns it.
func benchRegister(b *testing.B, h *hubtest.Hub, hc *http.Client, id string) agent {
	b.Helper()
	body, _ := json.Marshal(map[string]any{"session_id": id, "surface": "claude_code"})
	st, raw, err := benchPost(hc, h.URL+"/v1/sessions", h.APIKey, body)
	if err != nil || st != http.StatusCreated {
		b.Fatalf("register %s: %d %s %v", id, st, raw, err)
	}
	var r struct {
		SessionID string `json:"session_id"`
		Token     string `json:"token"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		b.Fatal(err)
	}
	return agent{ID: r.SessionID, Token: r.Token}
}

// benchDial attaches a's WebSocket and reads the welcome. The connection is
// closed when the benchmark ends.
func benchDial(b *testing.B, h *hubtest.Hub, a agent) *websocket.Conn {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	c, _, err := websocket.Dial(ctx, h.WSURL(), &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + a.Token}}})
	if err != nil {
		b.Fatalf("dial %s: %v", a.ID, err)
	}
	b.Cleanup(func() { c.CloseNow() })
	f, err := benchReadFrame(ctx, c)
	if err != nil || f.Type != "welcome" {
		b.Fatalf("%s: first frame %+v, %v; want welcome", a.ID, f, err)
	}
	return c
}

// benchFrame is the part of a hub frame the benchmarks look at.
type benchFrame struct {
	Type string `json:"type"`
	Seq  int64  `json:"seq"`
}

func benchReadFrame(ctx context.Context, c *websocket.Conn) (benchFrame, error) {
	var f benchFrame
	_, data, err := c.Read(ctx)
	if err != nil {
		return f, err
	}
	return f, json.Unmarshal(data, &f)
}

// frameStream reads a WebSocket's messages one after another as one
// stream, for a json.Decoder that decodes each frame in turn.
type frameStream struct {
	ctx context.Context
	c   *websocket.Conn
	r   io.Reader // the current message; nil between messages
}

func (s *frameStream) Read(p []byte) (int, error) {
	for {
		if s.r == nil {
			_, r, err := s.c.Reader(s.ctx)
			if err != nil {
				return 0, err
			}
			s.r = r
		}
		n, err := s.r.Read(p)
		if errors.Is(err, io.EOF) {
			s.r, err = nil, nil
		}
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// frameIsSignal decodes a frame's type as whether it is "signal", without
// allocating the string.
type frameIsSignal bool

func (k *frameIsSignal) UnmarshalJSON(b []byte) error {
	*k = string(b) == `"signal"`
	return nil
}

// ackEvery is how many signals a benchmark recipient reads between acks, as
// a client acking in batches would.
const ackEvery = 64

func benchAck(ctx context.Context, c *websocket.Conn, seq int64) error {
	return c.Write(ctx, websocket.MessageText, fmt.Appendf(nil, `{"type":"ack","up_to_seq":%d}`, seq))
}

// recipientReader reads an attached recipient's frames until its connection
// closes, acking as it goes, and publishes the highest seq seen. It also
// keeps an idle connection (a sender's) answering the hub's pings.
type recipientReader struct {
	last atomic.Int64
	done chan struct{}
	err  error // why the reader stopped; read only after done is closed
}

// stopped says why the reader stopped (its connection's close code and
// reason, or a decode error), or "" while it reads: a benchmark that finds
// its recipient gone says why, not only that.
func (r *recipientReader) stopped() string {
	if r == nil {
		return ""
	}
	select {
	case <-r.done:
		return fmt.Sprintf("recipient's reader stopped (close %d): %v", websocket.CloseStatus(r.err), r.err)
	default:
		return ""
	}
}

// benchDisconnects lists the hub's nonzero marconi_ws_disconnects_total
// series, for a benchmark's failure message.
func benchDisconnects(h *hubtest.Hub) string {
	mfs, err := h.Registry.Gather()
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "marconi_ws_disconnects_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v > 0 {
				for _, l := range m.GetLabel() {
					out = append(out, fmt.Sprintf("%s=%s:%g", l.GetName(), l.GetValue(), v))
				}
			}
		}
	}
	return "hub disconnects: [" + strings.Join(out, " ") + "]"
}

// startReader starts the reader of c; the benchmark's cleanup closes c and
// waits for it.
func startReader(b *testing.B, c *websocket.Conn) *recipientReader {
	r := &recipientReader{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		ctx := context.Background()
		// One decoder for every frame, and a frame decoded without keeping
		// its type: the reader is the benchmark's client, and what it
		// allocates per frame is not the hub's.
		dec := json.NewDecoder(&frameStream{ctx: ctx, c: c})
		var f struct {
			Signal frameIsSignal `json:"type"`
			Seq    int64         `json:"seq"`
		}
		for {
			f.Signal, f.Seq = false, 0
			if err := dec.Decode(&f); err != nil {
				r.err = err
				return
			}
			if f.Signal {
				r.last.Store(f.Seq)
				if f.Seq%ackEvery == 0 {
					if err := benchAck(ctx, c, f.Seq); err != nil {
						r.err = err
						return
					}
				}
			}
		}
	}()
	b.Cleanup(func() {
		c.CloseNow()
		<-r.done
	})
	return r
}

// maxLag is how many signals a closed-loop sender may be ahead of its
// recipient's reader: half the hub's queue of one connection
// (conns.DefaultQueueSize), so that a reader starved of CPU on a busy
// machine is never dropped as a slow consumer (close 4429) mid-benchmark.
const maxLag = 128

// keepUp waits, when the sender has sent more than maxLag signals the
// reader has not seen, until it is within maxLag/2 again; the send is
// answered before its frame is written, so a sender alone would outrun a
// reader on a busy machine. A nil reader (queued_offline) waits for nothing.
func (r *recipientReader) keepUp(b *testing.B, sent int64) {
	if r != nil && sent-r.last.Load() > maxLag {
		r.waitSeq(b, sent-maxLag/2)
	}
}

// waitSeq waits, with a deadline, until the reader has seen seq.
func (r *recipientReader) waitSeq(b *testing.B, seq int64) {
	deadline := time.Now().Add(benchTimeout)
	for r.last.Load() < seq {
		if why := r.stopped(); why != "" && r.last.Load() < seq {
			b.Fatalf("recipient saw seq %d, want %d: %s", r.last.Load(), seq, why)
		}
		if time.Now().After(deadline) {
			b.Fatalf("recipient saw seq %d, want %d", r.last.Load(), seq)
		}
		runtime.Gosched()
	}
}

// benchSendBody is a send of a small payload, about what an agent's "wake up,
// there is work" signal carries.
func benchSendBody(to string, i int) []byte {
	return fmt.Appendf(nil, `{"to_session":%q,"kind":"task.ready","payload":{"task":"T-%d","note":"ready for review"}}`, to, i)
}

// reportPercentiles reports p50 and p99 of lat (which it sorts) in µs.
func reportPercentiles(b *testing.B, prefix string, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[int(q*float64(len(lat)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(at(0.50), prefix+"p50_µs")
	b.ReportMetric(at(0.99), prefix+"p99_µs")
}

// sendPair is one attached sender and its recipient: attached (with a
// reader) for pushed_to_ws, registered but never attached for queued_offline.
type sendPair struct {
	from   agent
	to     agent
	reader *recipientReader // nil when offline
	sent   int64
}

func newSendPair(b *testing.B, h *hubtest.Hub, hc *http.Client, name, delivery string) *sendPair {
	p := &sendPair{from: benchRegister(b, h, hc, name+"-from"), to: benchRegister(b, h, hc, name+"-to")}
	// The sender holds its WebSocket, as a running agent does: the send
	// path then neither piggybacks nor evaluates the sender's self-heal.
	startReader(b, benchDial(b, h, p.from))
	if delivery == "pushed_to_ws" {
		p.reader = startReader(b, benchDial(b, h, p.to))
	}
	return p
}

// send does one send and checks it was answered 200 with want.
func (p *sendPair) send(hc *http.Client, h *hubtest.Hub, want []byte) error {
	p.sent++
	st, raw, err := benchPost(hc, h.URL+"/v1/signals", p.from.Token, benchSendBody(p.to.ID, int(p.sent)))
	if err != nil {
		return err
	}
	if st != http.StatusOK || !bytes.Contains(raw, want) {
		return fmt.Errorf("send %d: %d %s, want %s; %s; %s", p.sent, st, raw, want, p.reader.stopped(), benchDisconnects(h))
	}
	return nil
}

// BenchmarkSendNetHTTP is BenchmarkSend with net/http's http.Client as the
// sender: POST /v1/signals over real HTTP, one request at a time; ns/op is
// the latency a Go sender sees, from request to answer. For pushed_to_ws the
// recipient is attached and reads (and acks) every frame; the timer stops
// only when it has received the last one. For queued_offline the recipient
// is registered but has no WebSocket. Its allocs/op and B/op add the
// client's (about 78 allocs and 6.7 KB a send) to the hub's.
func BenchmarkSendNetHTTP(b *testing.B) {
	for _, store := range benchStores {
		for _, delivery := range []string{"pushed_to_ws", "queued_offline"} {
			b.Run(store+"/"+delivery, func(b *testing.B) {
				h := benchHub(b, store)
				hc := benchHTTP(b)
				p := newSendPair(b, h, hc, "serial", delivery)
				want := []byte(`"delivery":"` + delivery + `"`)
				lat := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					t0 := time.Now()
					if err := p.send(hc, h, want); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
					p.reader.keepUp(b, p.sent)
				}
				if p.reader != nil {
					p.reader.waitSeq(b, p.sent)
				}
				b.StopTimer()
				reportPercentiles(b, "send_", lat)
				b.ReportMetric(float64(p.sent)/b.Elapsed().Seconds(), "sends/s")
			})
		}
	}
}

// BenchmarkSendParallel is BenchmarkSend with 8 concurrent senders (4 per
// GOMAXPROCS on this 2-core machine), each to a recipient of its own:
// sends/s is the hub's throughput with the client in the same process.
func BenchmarkSendParallel(b *testing.B) {
	const parallelism = 4
	for _, store := range benchStores {
		for _, delivery := range []string{"pushed_to_ws", "queued_offline"} {
			b.Run(store+"/"+delivery, func(b *testing.B) {
				h := benchHub(b, store)
				hc := benchHTTP(b)
				n := parallelism * runtime.GOMAXPROCS(0)
				pairs := make([]*sendPair, n)
				for i := range pairs {
					pairs[i] = newSendPair(b, h, hc, fmt.Sprintf("par%d", i), delivery)
				}
				want := []byte(`"delivery":"` + delivery + `"`)
				var next atomic.Int64
				b.SetParallelism(parallelism)
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					p := pairs[int(next.Add(1)-1)%n]
					for pb.Next() {
						if err := p.send(hc, h, want); err != nil {
							b.Error(err)
							return
						}
					}
				})
				var total int64
				for _, p := range pairs {
					if p.reader != nil {
						p.reader.waitSeq(b, p.sent)
					}
					total += p.sent
				}
				b.StopTimer()
				b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "sends/s")
			})
		}
	}
}

// BenchmarkSendToFrame is the end-to-end latency of one signal: from the
// start of the sender's POST to the recipient reading the signal's frame off
// its WebSocket. One signal is in flight at a time; the recipient acks every
// 64 frames on the same connection.
func BenchmarkSendToFrame(b *testing.B) {
	for _, store := range benchStores {
		b.Run(store, func(b *testing.B) {
			h := benchHub(b, store)
			hc := benchHTTP(b)
			from := benchRegister(b, h, hc, "e2e-from")
			to := benchRegister(b, h, hc, "e2e-to")
			startReader(b, benchDial(b, h, from))
			rc := benchDial(b, h, to)
			want := []byte(`"delivery":"pushed_to_ws"`)
			lat := make([]time.Duration, 0, b.N)
			var seq int64
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				seq++
				t0 := time.Now()
				st, raw, err := benchPost(hc, h.URL+"/v1/signals", from.Token, benchSendBody(to.ID, int(seq)))
				if err != nil || st != http.StatusOK || !bytes.Contains(raw, want) {
					b.Fatalf("send %d: %d %s %v", seq, st, raw, err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
				for {
					f, err := benchReadFrame(ctx, rc)
					if err != nil {
						cancel()
						b.Fatalf("waiting for seq %d: %v", seq, err)
					}
					if f.Type == "signal" && f.Seq == seq {
						break
					}
				}
				lat = append(lat, time.Since(t0))
				if seq%ackEvery == 0 {
					if err := benchAck(ctx, rc, seq); err != nil {
						cancel()
						b.Fatal(err)
					}
				}
				cancel()
			}
			b.StopTimer()
			reportPercentiles(b, "e2e_", lat)
		})
	}
}

// BenchmarkIdleWebSocket attaches b.N idle WebSockets (run it with
// -benchtime=1000x) and reports what they hold once attached: live heap and
// goroutine stacks per connection after a GC, and goroutines per connection,
// split into the hub's and the in-process client's. ns/op is the time of one
// attach (welcome read), registration excluded. The heap and stack figures
// include the client end of each connection; docs/benchmarks-history.md has the
// hub-only figure measured across processes with cmd/marconi-bench.
func BenchmarkIdleWebSocket(b *testing.B) {
	const maxConns = 5000
	if b.N > maxConns {
		b.Skipf("%d connections is more than this benchmark attaches (%d); run it with -benchtime=1000x", b.N, maxConns)
	}
	h := benchHub(b, "memstore")
	hc := benchHTTP(b)
	agents := make([]agent, b.N)
	for i := range agents {
		agents[i] = benchRegister(b, h, hc, fmt.Sprintf("idle-%d", i))
	}
	hc.Transport.(*http.Transport).CloseIdleConnections()

	before := memSnapshot()
	b.ResetTimer()
	conns := make([]*websocket.Conn, 0, b.N)
	for i := range b.N {
		// benchDial registers no reader: an idle client reads nothing, and the
		// benchmark ends well before the hub's first ping (20 s) needs a pong.
		conns = append(conns, benchDial(b, h, agents[i]))
	}
	b.StopTimer()
	after := memSnapshot()
	n := float64(b.N)
	b.ReportMetric(float64(after.heap-before.heap)/n, "heap_B/conn")
	b.ReportMetric(float64(after.stack-before.stack)/n, "stack_B/conn")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/n, "goroutines/conn")
	b.ReportMetric(float64(after.hubGoroutines-before.hubGoroutines)/n, "hub_goroutines/conn")
	runtime.KeepAlive(conns)
}

type memState struct {
	heap, stack               uint64
	goroutines, hubGoroutines int
}

// memSnapshot collects garbage and reads the live heap, the goroutine
// stacks and the goroutines, counting apart those running the hub's code.
func memSnapshot() memState {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := memState{heap: ms.HeapAlloc, stack: ms.StackInuse, goroutines: runtime.NumGoroutine()}
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		// A hub goroutine is one whose stack runs hub code, or net/http's
		// server conn loop (the attach handler's goroutine, while it waits).
		if strings.Contains(g, "marconi/hub.(*Server)") || strings.Contains(g, "marconi/hub/conns.") || strings.Contains(g, "net/http.(*conn).serve") {
			s.hubGoroutines++
		}
	}
	return s
}

// BenchmarkSelfHealEvaluate is the cost of the SPEC-168 gates on one send,
// outside HTTP and the store. signals/selfheal has tests but no benchmark;
// this one drives its public API.
func BenchmarkSelfHealEvaluate(b *testing.B) {
	newEval := func(b *testing.B) *selfheal.Evaluator {
		cfg := selfheal.DefaultConfig()
		cfg.Enabled = true
		ev, err := selfheal.New(cfg, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		return ev
	}
	now := time.Now()
	party := func(session string, attached bool) selfheal.Party {
		return selfheal.Party{TenantID: "t1", ProjectID: "p1", SessionID: session, Surface: "claude_code", ProofOfLife: now, HasQueue: attached}
	}
	b.Run("both_attached", func(b *testing.B) {
		ev := newEval(b)
		r, s := party("r", true), party("s", true)
		b.ReportAllocs()
		for range b.N {
			ev.Spend(r, s)
		}
	})
	b.Run("recipient_offline_one_session", func(b *testing.B) {
		// Three attempts, then rate_limited: every call reads and writes the
		// one bucket.
		ev := newEval(b)
		r, s := party("r", false), party("s", true)
		b.ReportAllocs()
		for range b.N {
			ev.Spend(r, s)
		}
	})
	b.Run("both_offline_100k_sessions", func(b *testing.B) {
		// Both sides gated, over 100k distinct recipients: the bucket map
		// grows to 100k entries, as under a fleet of agents.
		ev := newEval(b)
		ids := make([]selfheal.Party, 100_000)
		for i := range ids {
			ids[i] = party(fmt.Sprintf("agent-%06d", i), false)
		}
		s := party("s", false)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			ev.Spend(ids[i%len(ids)], s)
		}
		b.ReportMetric(float64(ev.Len()), "buckets")
	})
	b.Run("recipient_offline_parallel", func(b *testing.B) {
		// Every send of the hub shares one Evaluator and its one mutex.
		ev := newEval(b)
		var next atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r, s := party(fmt.Sprintf("r%d", next.Add(1)), false), party("s", true)
			for pb.Next() {
				ev.Spend(r, s)
			}
		})
	})
}
