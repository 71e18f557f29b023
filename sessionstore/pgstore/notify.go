package pgstore

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// Wake-up bus: Postgres LISTEN/NOTIFY between the hub instances that share a
// database. Each instance listens on its own channel; the payload names the
// stored signals (tenant, project, session, seq) and nothing else: one
// object, or an array of them when a batch wakes several sessions there.

// channelSQL computes an instance's channel. Channels are database-wide while
// the tables live in the search_path's schema, so the schema is part of the
// name: deployments (and parallel tests) in other schemas of one database
// never hear each other. The md5 keeps any instance id within Postgres's
// 63-byte identifier limit.
const channelSQL = `'marconi_wake_' || md5(coalesce(current_schema(), '') || '/' || $1::text)`

// livenessKeySQL computes the key of an instance's liveness lock: a
// session-level advisory lock that the instance's listener connection holds
// while it lives. Postgres releases it the moment that connection ends (the
// process was killed, its host lost the database), so the other instances
// see the death within one probe rather than after the heartbeat window. Like
// the channel, the key covers the schema.
const livenessKeySQL = `('x' || substr(md5('marconi-liveness/' || coalesce(current_schema(), '') || '/' || $1::text), 1, 16))::bit(64)::bigint`

// ListenerApplicationName is the application_name of the listener's
// connection, as pg_stat_activity shows it.
const ListenerApplicationName = "marconi-wake-listener"

// MaxWakePayload bounds a wake-up payload, well under Postgres's 8000 bytes.
const MaxWakePayload = 2048

// maxWakeField bounds each of tenant, project and session id in a payload.
const maxWakeField = 256

// MaxWakeBatchPayload bounds a payload that carries several wake-ups (a JSON
// array, EncodeWakes): under Postgres's limit (a NOTIFY payload must be
// shorter than 8000 bytes) with room to spare. One wake-up of the longest
// valid fields, every byte escaped, takes under 4700 bytes, so it always fits.
const MaxWakeBatchPayload = 7680

// MaxWakeBatch bounds how many wake-ups one payload carries.
const MaxWakeBatch = 128

// Listener timings.
const (
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
	// listenIdleCheck: a listener that heard nothing for this long checks
	// its connection, so a half-open one is noticed and replaced.
	listenIdleCheck = 30 * time.Second
	// listenCallTimeout bounds connecting, LISTEN and the idle check.
	listenCallTimeout = 10 * time.Second
	// livenessRetry is how soon a listener that could not take its
	// liveness lock tries again.
	livenessRetry = 500 * time.Millisecond
)

// wakePayload is the JSON of a wake-up. A bare one names the session and
// seq only; one that carries its signal (sessionstore.Wake.Signal) adds the
// signal, the session's incarnation and a MAC over the entry, keyed by the
// database's bus key (migration 0008), since any role that can connect may
// NOTIFY: a carried signal whose MAC does not check out is dropped, and the
// wake-up is a bare one.
type wakePayload struct {
	Tenant  string `json:"tenant"`
	Project string `json:"project"`
	Session string `json:"session"`
	Seq     *int64 `json:"seq"` // required: nil when the payload has none

	RegisteredAt *time.Time  `json:"registered_at,omitempty"`
	Signal       *wakeSignal `json:"signal,omitempty"`
	MAC          []byte      `json:"mac,omitempty"`
}

// wakeSignal is a carried signal; Payload is the sender's JSON text as a
// string, so its bytes travel unchanged.
type wakeSignal struct {
	ID             string    `json:"id"`
	From           string    `json:"from"`
	Kind           string    `json:"kind"`
	Payload        *string   `json:"payload,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Delivery       string    `json:"delivery"`
	RouteState     string    `json:"route_state"`
}

// Wake is one wake-up (sessionstore.Wake).
type Wake = sessionstore.Wake

// wakeCodec encodes and decodes wake-ups with key, the bus key: without
// one (nil), signals are neither carried nor accepted.
type wakeCodec struct{ key []byte }

// EncodeWake is the NOTIFY payload of a bare wake-up for k's signal seq, in
// the object form (EncodeWakes packs several).
func EncodeWake(k sessionstore.Key, seq int64) (string, error) {
	b, err := wakeCodec{}.entry(Wake{Key: k, Seq: seq})
	if err != nil {
		return "", err
	}
	if len(b) > MaxWakePayload {
		return "", fmt.Errorf("wake-up payload of %d bytes is over %d", len(b), MaxWakePayload)
	}
	return string(b), nil
}

// DecodeWake parses a NOTIFY payload. The payload is untrusted (anyone who
// can connect to the database can NOTIFY): anything but one well-formed,
// bounded JSON object naming a session and a seq (positive, or 0 for a
// check wake-up) is an error. Unknown fields are ignored, so that a newer
// instance may add some; a carried signal is ignored too (DecodeWake has no
// key to check it with).
func DecodeWake(payload string) (sessionstore.Key, int64, error) {
	if len(payload) > MaxWakePayload {
		return sessionstore.Key{}, 0, fmt.Errorf("wake-up payload of %d bytes is over %d", len(payload), MaxWakePayload)
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(payload)))
	var p wakePayload
	if err := dec.Decode(&p); err != nil {
		return sessionstore.Key{}, 0, fmt.Errorf("malformed wake-up: %w", err)
	}
	if !onlySpace(payload[dec.InputOffset():]) {
		return sessionstore.Key{}, 0, errors.New("malformed wake-up: data after the object")
	}
	if err := p.validate(); err != nil {
		return sessionstore.Key{}, 0, err
	}
	return sessionstore.Key{TenantID: p.Tenant, ProjectID: p.Project, SessionID: p.Session}, *p.Seq, nil
}

// EncodeWakes packs bare wake-ups for wakes, in order, into as few NOTIFY
// payloads as fit (see wakeCodec.encode); carried signals are left out.
func EncodeWakes(wakes []Wake) ([]string, error) { return wakeCodec{}.encode(wakes) }

// DecodeWakes parses a NOTIFY payload of either form (see wakeCodec.decode),
// as bare wake-ups: carried signals are dropped.
func DecodeWakes(payload string) ([]Wake, error) { return wakeCodec{}.decode(payload) }

// encode packs wakes, in order, into as few NOTIFY payloads as fit, each of
// at most MaxWakeBatchPayload bytes and MaxWakeBatch wake-ups. A payload of
// one wake-up is the object form when that fits MaxWakePayload, which
// instances older than the array form understand; any other is a JSON array
// of such objects. A wake-up carries its signal when the codec has a key and
// the entry fits one payload; otherwise it goes bare. It refuses wakes that
// decode would refuse.
func (c wakeCodec) encode(wakes []Wake) ([]string, error) {
	var (
		payloads []string
		entries  []string
		size     = 1 // the array's "[", and "," or "]" after each entry
	)
	flush := func() {
		if len(entries) == 1 && len(entries[0]) <= MaxWakePayload {
			payloads = append(payloads, entries[0])
		} else if len(entries) > 0 {
			payloads = append(payloads, "["+strings.Join(entries, ",")+"]")
		}
		entries, size = entries[:0], 1
	}
	for _, w := range wakes {
		b, err := c.entry(w)
		if err != nil {
			return nil, err
		}
		if len(entries) == MaxWakeBatch || size+len(b)+1 > MaxWakeBatchPayload {
			flush()
		}
		entries, size = append(entries, string(b)), size+len(b)+1
	}
	flush()
	return payloads, nil
}

// entry is the JSON object of w: with its signal when the codec has a key
// and the object fits a payload on its own, else bare.
func (c wakeCodec) entry(w Wake) ([]byte, error) {
	p := wakePayload{Tenant: w.Key.TenantID, Project: w.Key.ProjectID, Session: w.Key.SessionID, Seq: &w.Seq}
	if err := p.validate(); err != nil {
		return nil, err
	}
	if c.key != nil && w.Signal != nil && w.Signal.Seq == w.Seq && w.Signal.To == w.Key {
		carried := p
		carried.RegisteredAt, carried.Signal = &w.Incarnation, toWakeSignal(*w.Signal)
		if b, err := c.seal(carried); err == nil && len(b) < MaxWakeBatchPayload-1 {
			return b, nil
		}
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode wake-up: %w", err)
	}
	return b, nil
}

// seal is p's JSON with its MAC set.
func (c wakeCodec) seal(p wakePayload) ([]byte, error) {
	p.MAC = nil
	unsealed, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	p.MAC = c.mac(unsealed)
	return json.Marshal(p)
}

// mac is the HMAC-SHA256 of b under the codec's key.
func (c wakeCodec) mac(b []byte) []byte {
	h := hmac.New(sha256.New, c.key)
	h.Write(b)
	return h.Sum(nil)
}

// carried returns the signal p carries when its MAC checks out under the
// codec's key and it is well formed, else nil (a bare wake-up).
func (c wakeCodec) carried(p wakePayload) (*sessionstore.Signal, time.Time) {
	if c.key == nil || p.Signal == nil || p.RegisteredAt == nil || p.MAC == nil {
		return nil, time.Time{}
	}
	got := p.MAC
	p.MAC = nil
	unsealed, err := json.Marshal(p)
	if err != nil || !hmac.Equal(got, c.mac(unsealed)) {
		return nil, time.Time{}
	}
	ws := p.Signal
	if ws.ID == "" || (ws.Payload != nil && !json.Valid([]byte(*ws.Payload))) {
		return nil, time.Time{}
	}
	sig := &sessionstore.Signal{
		ID: ws.ID, Seq: *p.Seq, To: sessionstore.Key{TenantID: p.Tenant, ProjectID: p.Project, SessionID: p.Session},
		FromSession: ws.From, Kind: ws.Kind, CreatedAt: ws.CreatedAt.UTC(), IdempotencyKey: ws.IdempotencyKey,
		Delivery: marconi.Delivery(ws.Delivery), RouteState: marconi.RouteState(ws.RouteState),
	}
	if ws.Payload != nil {
		sig.Payload = json.RawMessage(*ws.Payload)
	}
	return sig, p.RegisteredAt.UTC()
}

func toWakeSignal(sig sessionstore.Signal) *wakeSignal {
	ws := &wakeSignal{
		ID: sig.ID, From: sig.FromSession, Kind: sig.Kind, CreatedAt: sig.CreatedAt,
		IdempotencyKey: sig.IdempotencyKey, Delivery: string(sig.Delivery), RouteState: string(sig.RouteState),
	}
	if sig.Payload != nil {
		p := string(sig.Payload)
		ws.Payload = &p
	}
	return ws
}

// decode parses a NOTIFY payload of either form: one object (as every
// instance sends one wake-up) or an array of 1 to MaxWakeBatch such objects
// of at most MaxWakeBatchPayload bytes in all. It is as strict as
// DecodeWake: one malformed entry refuses the whole payload. A carried
// signal is kept only when its MAC checks out under the codec's key.
func (c wakeCodec) decode(payload string) ([]Wake, error) {
	var ps []wakePayload
	if !strings.HasPrefix(strings.TrimLeft(payload, jsonSpace), "[") {
		if len(payload) > MaxWakePayload {
			return nil, fmt.Errorf("wake-up payload of %d bytes is over %d", len(payload), MaxWakePayload)
		}
		dec := json.NewDecoder(strings.NewReader(payload))
		var p wakePayload
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("malformed wake-up: %w", err)
		}
		if !onlySpace(payload[dec.InputOffset():]) {
			return nil, errors.New("malformed wake-up: data after the object")
		}
		ps = []wakePayload{p}
	} else {
		if len(payload) > MaxWakeBatchPayload {
			return nil, fmt.Errorf("wake-up payload of %d bytes is over %d", len(payload), MaxWakeBatchPayload)
		}
		dec := json.NewDecoder(strings.NewReader(payload))
		if err := dec.Decode(&ps); err != nil {
			return nil, fmt.Errorf("malformed wake-ups: %w", err)
		}
		if !onlySpace(payload[dec.InputOffset():]) {
			return nil, errors.New("malformed wake-ups: data after the array")
		}
		if len(ps) == 0 || len(ps) > MaxWakeBatch {
			return nil, fmt.Errorf("wake-up array of %d entries, want 1 to %d", len(ps), MaxWakeBatch)
		}
	}
	wakes := make([]Wake, len(ps))
	for i, p := range ps {
		if err := p.validate(); err != nil {
			if len(ps) == 1 {
				return nil, err
			}
			return nil, fmt.Errorf("wake-up %d: %w", i, err)
		}
		wakes[i] = Wake{Key: sessionstore.Key{TenantID: p.Tenant, ProjectID: p.Project, SessionID: p.Session}, Seq: *p.Seq}
		wakes[i].Signal, wakes[i].Incarnation = c.carried(p)
	}
	return wakes, nil
}

// jsonSpace is JSON's whitespace.
const jsonSpace = " \t\r\n"

// onlySpace reports whether s is JSON whitespace only. (A json.Decoder's
// More is false at a stray "]" or "}", so it cannot tell.)
func onlySpace(s string) bool { return strings.Trim(s, jsonSpace) == "" }

func (p wakePayload) validate() error {
	for _, f := range []struct{ name, v string }{{"tenant", p.Tenant}, {"project", p.Project}, {"session", p.Session}} {
		if f.v == "" || len(f.v) > maxWakeField {
			return fmt.Errorf("wake-up %s must have 1 to %d bytes", f.name, maxWakeField)
		}
	}
	if p.Seq == nil {
		return errors.New("wake-up has no seq")
	}
	if *p.Seq < 0 { // 0 is a check wake-up (fabric.CheckSeq)
		return fmt.Errorf("wake-up seq %d is negative", *p.Seq)
	}
	return nil
}

// Bus is the Postgres wake-up bus (fabric.Bus) of a Store. Publish sends
// NOTIFY on a pooled connection of its own, after the signal's append
// committed and outside any append's transaction, batched: concurrent
// publishers share one statement of at most the store's WithMaxBatch
// wake-ups, and eight times as many wait for one (Postgres serialises
// notifying commits on one global lock, so fewer is faster). Listen holds a dedicated connection
// of its own. It is safe for concurrent use.
type Bus struct {
	store    *Store
	log      *slog.Logger
	notifier *committer

	keyMu   sync.Mutex
	key     []byte    // the bus key (migration 0008); nil until read
	keyRead time.Time // when reading it last failed
}

// NewBus returns the wake-up bus of s. A nil log discards.
func NewBus(s *Store, log *slog.Logger) *Bus {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Bus{store: s, log: log}
	b.notifier = newCommitter(s.maxBatch, 8*s.maxBatch, b.runWakes)
	return b
}

// keyRetry spaces the reads of a bus key that could not be read (the
// schema not yet migrated): meanwhile wake-ups go bare.
const keyRetry = 5 * time.Second

// keyReadTimeout bounds reading the bus key, so that the listener, which
// reads it on its first wake-up, never waits long for a pooled connection.
const keyReadTimeout = 2 * time.Second

// Publish sends w to instance's channel, with the next batch of wake-ups
// (notifySQL), and returns once that NOTIFY is sent. w carries its signal
// when it fits a payload and the bus key is known. Returns an error wrapping
// sessionstore.ErrUnavailable when Postgres cannot be reached.
func (b *Bus) Publish(ctx context.Context, instance string, w sessionstore.Wake) error {
	if _, err := (wakeCodec{}).entry(w); err != nil {
		return err
	}
	if b.store.closed.Load() {
		return wrap("publish wake-up", fmt.Errorf("store closed: %w", sessionstore.ErrUnavailable))
	}
	r := &appendReq{wake: &wakeReq{instance: instance, w: w}}
	if err := b.notifier.do(ctx, r); err != nil {
		return wrap("publish wake-up", fmt.Errorf("%w: %w", sessionstore.ErrUnavailable, err))
	}
	return wrap("publish wake-up", r.out.err)
}

// runWakes sends batch's wake-ups in one statement, a transaction of its
// own that does not wait for its commit to be flushed (a wake-up is a hint:
// one lost in a crash is the sweep's), and sets each one's outcome.
func (b *Bus) runWakes(batch []*appendReq) {
	ctx, cancel, err := b.store.call(context.Background())
	defer cancel()
	if err == nil {
		instances, payloads := batchWakes(batch, wakeCodec{key: b.macKey(ctx)})
		_, err = b.store.pool.Exec(ctx, notifySQL, instances, payloads)
	}
	for _, r := range batch {
		r.out = appendOutcome{err: err}
	}
}

// notifySQL sends the NOTIFYs of a batch (batchWakes: one per instance
// unless its wake-ups overflow one payload).
const notifySQL = `SELECT set_config('synchronous_commit', 'off', true),
	(SELECT count(pg_notify(` + "'marconi_wake_' || md5(coalesce(current_schema(), '') || '/' || i), p)" + `)
	 FROM unnest($1::text[], $2::text[]) AS x(i, p))`

// macKey is the bus key, read once; nil while it cannot be read.
func (b *Bus) macKey(ctx context.Context) []byte {
	b.keyMu.Lock()
	defer b.keyMu.Unlock()
	if b.key != nil || time.Since(b.keyRead) < keyRetry {
		return b.key
	}
	var key []byte
	ctx, cancel := context.WithTimeout(ctx, keyReadTimeout)
	defer cancel()
	if err := b.store.pool.QueryRow(ctx, `SELECT key FROM bus_key WHERE id = 1`).Scan(&key); err != nil {
		b.keyRead = time.Now()
		b.log.Debug("bus key not readable; wake-ups carry no signal until it is", "err", err)
		return nil
	}
	b.key = key
	return key
}

// SealWakes encodes wakes as EncodeWakes does, each carrying its signal
// sealed under the bus key when that key is known, for a bus other than
// NOTIFY (fabric/natsbus) to carry: the same payloads, the same MAC.
func (b *Bus) SealWakes(ctx context.Context, wakes []Wake) ([]string, error) {
	return wakeCodec{key: b.macKey(ctx)}.encode(wakes)
}

// OpenWakes decodes a payload as DecodeWakes does, keeping a carried signal
// only when its MAC checks out under the bus key: the other half of
// SealWakes.
func (b *Bus) OpenWakes(ctx context.Context, payload string) ([]Wake, error) {
	return wakeCodec{key: b.macKey(ctx)}.decode(payload)
}

// Channel is the NOTIFY channel that instance listens on, in this store's
// schema; for operators (pg_stat_activity, psql) and tests.
func (b *Bus) Channel(ctx context.Context, instance string) (string, error) {
	ctx, cancel, err := b.store.call(ctx)
	defer cancel()
	if err != nil {
		return "", wrap("wake-up channel", err)
	}
	var ch string
	err = b.store.pool.QueryRow(ctx, `SELECT `+channelSQL, instance).Scan(&ch)
	return ch, wrap("wake-up channel", err)
}

// lockLiveness takes instance's liveness lock on conn, without waiting:
// false when another connection holds it (the backend of a process of the
// same id that was just killed has not ended yet, or, misconfigured, a live
// process with the same MARCONI_INSTANCE_ID). The caller tries again.
func (b *Bus) lockLiveness(ctx context.Context, conn *pgx.Conn, instance string) (bool, error) {
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+livenessKeySQL+`)`, instance).Scan(&ok); err != nil {
		return false, fmt.Errorf("liveness lock: %w", err)
	}
	if !ok {
		b.log.Warn("another connection holds this instance's liveness lock; retrying (a killed process of the same instance id not yet gone, or two processes share MARCONI_INSTANCE_ID)",
			"instance", instance)
	}
	return ok, nil
}

// ConnectedInstances returns the ids of the instances in the instance table
// whose listener connection is alive now: each holds its liveness lock
// (Listen takes it). An instance killed in any way loses it as soon as
// Postgres sees its connection end; the heartbeat remains the judge of
// hangs and partitions. server names the Postgres server that answered (its
// postmaster's start time): locks live in one server's memory, so after a
// failover or a restart none is held until each listener takes its lock
// again there. Returns an error wrapping sessionstore.ErrUnavailable when
// Postgres cannot be reached.
func (b *Bus) ConnectedInstances(ctx context.Context) (live map[string]bool, server string, err error) {
	ctx, cancel, err := b.store.call(ctx)
	defer cancel()
	if err != nil {
		return nil, "", wrap("connected instances", err)
	}
	var ids []string
	err = b.store.pool.QueryRow(ctx, `
		WITH k AS (SELECT id, `+strings.ReplaceAll(livenessKeySQL, "$1::text", "id")+` AS key FROM instances)
		SELECT pg_postmaster_start_time()::text, coalesce(array_agg(k.id) FILTER (WHERE EXISTS (
			SELECT 1 FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
			  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND l.classid::bigint = (k.key >> 32) & 4294967295
			  AND l.objid::bigint = k.key & 4294967295)), '{}')
		FROM k`).Scan(&server, &ids)
	if err != nil {
		return nil, "", wrap("connected instances", err)
	}
	live = make(map[string]bool, len(ids))
	for _, id := range ids {
		live[id] = true
	}
	return live, server, nil
}

// Listen listens on instance's channel on a dedicated connection and hands
// every well-formed wake-up to onWake, until ctx ends; the same connection
// holds instance's liveness lock (ConnectedInstances); then it closes the
// connection and returns nil. A dropped connection is replaced with
// exponential backoff (and full jitter); onConnect runs each time LISTEN is
// in place, because wake-ups sent meanwhile are lost. onWake and onConnect
// run on Listen's goroutine and must not block for long.
func (b *Bus) Listen(ctx context.Context, instance string, onWake func(sessionstore.Wake), onConnect func()) error {
	backoff := listenBackoffMin
	for {
		listened, err := b.listenOnce(ctx, instance, onWake, onConnect)
		if ctx.Err() != nil {
			return nil
		}
		if listened {
			backoff = listenBackoffMin
		}
		wait := rand.N(backoff) + time.Millisecond
		if listened {
			b.log.Warn("wake-up listener lost its connection; reconnecting (signals meanwhile arrive by the pending sweep)",
				"instance", instance, "retry_in", wait, "err", err)
		} else {
			// It never had a connection: say so, and why.
			b.log.Warn("wake-up listener cannot connect; retrying (signals meanwhile arrive by the pending sweep)",
				"instance", instance, "retry_in", wait, "cause", Diagnose(err))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, listenBackoffMax)
	}
}

// listenOnce runs one connection: connect, LISTEN, onConnect, then wait for
// notifications until the connection fails or ctx ends. listened reports
// whether LISTEN was in place.
func (b *Bus) listenOnce(ctx context.Context, instance string, onWake func(sessionstore.Wake), onConnect func()) (listened bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, listenCallTimeout)
	defer cancel()
	cfg := b.store.pool.Config().ConnConfig // a copy
	cfg.RuntimeParams["application_name"] = ListenerApplicationName
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	var channel string
	if err := conn.QueryRow(cctx, `SELECT `+channelSQL, instance).Scan(&channel); err != nil {
		return false, fmt.Errorf("channel name: %w", err)
	}
	locked, err := b.lockLiveness(cctx, conn, instance)
	if err != nil {
		return false, err
	}
	if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	b.log.Debug("wake-up listener listening", "instance", instance, "channel", channel)
	onConnect()
	for {
		wait := listenIdleCheck
		if !locked {
			wait = livenessRetry
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			wakes, derr := wakeCodec{key: b.macKey(ctx)}.decode(n.Payload)
			if derr != nil {
				b.log.Warn("ignoring a malformed wake-up", "channel", channel, "err", derr)
				continue
			}
			for _, w := range wakes {
				onWake(w)
			}
		case ctx.Err() != nil:
			return true, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded) && !locked:
			pctx, cancel := context.WithTimeout(ctx, listenCallTimeout)
			locked, err = b.lockLiveness(pctx, conn, instance)
			cancel()
			if err != nil {
				return true, err
			}
		case errors.Is(err, context.DeadlineExceeded):
			// Quiet for a while: make sure the connection still works.
			pctx, cancel := context.WithTimeout(ctx, listenCallTimeout)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return true, fmt.Errorf("idle check: %w", err)
			}
		default:
			return true, fmt.Errorf("wait for notification: %w", err)
		}
	}
}
