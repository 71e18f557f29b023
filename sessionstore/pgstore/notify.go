package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

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

// wakePayload is the JSON of a wake-up.
type wakePayload struct {
	Tenant  string `json:"tenant"`
	Project string `json:"project"`
	Session string `json:"session"`
	Seq     *int64 `json:"seq"` // required: nil when the payload has none
}

// EncodeWake is the NOTIFY payload of a wake-up for k's signal seq, in the
// object form (EncodeWakes packs several).
func EncodeWake(k sessionstore.Key, seq int64) (string, error) {
	b, err := encodeEntry(Wake{Key: k, Seq: seq})
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
// check wake-up) is an error.
// Unknown fields are ignored, so that a newer instance may add some.
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

// Wake is one wake-up: k's signal seq is stored.
type Wake struct {
	Key sessionstore.Key
	Seq int64
}

// EncodeWakes packs wakes, in order, into as few NOTIFY payloads as fit, each
// of at most MaxWakeBatchPayload bytes and MaxWakeBatch wake-ups. A payload
// of one wake-up is EncodeWake's object when that fits MaxWakePayload, which
// instances older than the array form understand; any other is a JSON array
// of such objects. It refuses wakes that DecodeWakes would refuse.
func EncodeWakes(wakes []Wake) ([]string, error) {
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
		b, err := encodeEntry(w)
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

// encodeEntry is the JSON object of w.
func encodeEntry(w Wake) ([]byte, error) {
	p := wakePayload{Tenant: w.Key.TenantID, Project: w.Key.ProjectID, Session: w.Key.SessionID, Seq: &w.Seq}
	if err := p.validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode wake-up: %w", err)
	}
	return b, nil
}

// DecodeWakes parses a NOTIFY payload of either form: one object (DecodeWake,
// as every instance sends one wake-up) or an array of 1 to MaxWakeBatch such
// objects of at most MaxWakeBatchPayload bytes in all (EncodeWakes). It is as
// strict as DecodeWake: one malformed entry refuses the whole payload.
func DecodeWakes(payload string) ([]Wake, error) {
	if !strings.HasPrefix(strings.TrimLeft(payload, jsonSpace), "[") {
		k, seq, err := DecodeWake(payload)
		if err != nil {
			return nil, err
		}
		return []Wake{{Key: k, Seq: seq}}, nil
	}
	if len(payload) > MaxWakeBatchPayload {
		return nil, fmt.Errorf("wake-up payload of %d bytes is over %d", len(payload), MaxWakeBatchPayload)
	}
	dec := json.NewDecoder(strings.NewReader(payload))
	var ps []wakePayload
	if err := dec.Decode(&ps); err != nil {
		return nil, fmt.Errorf("malformed wake-ups: %w", err)
	}
	if !onlySpace(payload[dec.InputOffset():]) {
		return nil, errors.New("malformed wake-ups: data after the array")
	}
	if len(ps) == 0 || len(ps) > MaxWakeBatch {
		return nil, fmt.Errorf("wake-up array of %d entries, want 1 to %d", len(ps), MaxWakeBatch)
	}
	wakes := make([]Wake, len(ps))
	for i, p := range ps {
		if err := p.validate(); err != nil {
			return nil, fmt.Errorf("wake-up %d: %w", i, err)
		}
		wakes[i] = Wake{Key: sessionstore.Key{TenantID: p.Tenant, ProjectID: p.Project, SessionID: p.Session}, Seq: *p.Seq}
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

// Bus is the Postgres wake-up bus (fabric.Bus) of a Store: Publish sends
// NOTIFY through the store's pool; Listen holds a dedicated connection of its
// own. It is safe for concurrent use.
type Bus struct {
	store *Store
	log   *slog.Logger
}

// NewBus returns the wake-up bus of s. A nil log discards.
func NewBus(s *Store, log *slog.Logger) *Bus {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Bus{store: s, log: log}
}

// Publish sends a wake-up to instance's channel. With group commit on, it
// rides the store's next batch (in one NOTIFY per instance with the batch's
// other wake-ups for it, EncodeWakes, in that batch's transaction) instead
// of a transaction of its own. Returns an error wrapping
// sessionstore.ErrUnavailable when Postgres cannot be reached.
func (b *Bus) Publish(ctx context.Context, instance string, k sessionstore.Key, seq int64) error {
	payloads, err := EncodeWakes([]Wake{{Key: k, Seq: seq}})
	if err != nil {
		return err
	}
	if b.store.group != nil {
		return wrap("publish wake-up", b.store.commit(ctx, &appendReq{wake: &wakeReq{instance: instance, k: k, seq: seq}}))
	}
	ctx, cancel, err := b.store.call(ctx)
	defer cancel()
	if err != nil {
		return wrap("publish wake-up", err)
	}
	_, err = b.store.pool.Exec(ctx, `SELECT pg_notify(`+channelSQL+`, $2)`, instance, payloads[0])
	return wrap("publish wake-up", err)
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
func (b *Bus) Listen(ctx context.Context, instance string, onWake func(sessionstore.Key, int64), onConnect func()) error {
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
func (b *Bus) listenOnce(ctx context.Context, instance string, onWake func(sessionstore.Key, int64), onConnect func()) (listened bool, err error) {
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
			wakes, derr := DecodeWakes(n.Payload)
			if derr != nil {
				b.log.Warn("ignoring a malformed wake-up", "channel", channel, "err", derr)
				continue
			}
			for _, w := range wakes {
				onWake(w.Key, w.Seq)
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
