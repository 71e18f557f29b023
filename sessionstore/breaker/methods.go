package breaker

import (
	"context"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// Every method of sessionstore.Store goes through the breaker, but Close,
// which must always reach the store.

// Close closes the wrapped store.
func (b *Store) Close() error { return b.inner.Close() }

// Ping implements sessionstore.Store.
func (b *Store) Ping(ctx context.Context) error {
	return guardErr(b, ctx, func() error { return b.inner.Ping(ctx) })
}

// CreateSession implements sessionstore.Store.
func (b *Store) CreateSession(ctx context.Context, s sessionstore.Session, now time.Time) (sessionstore.Session, error) {
	return guard(b, ctx, func() (sessionstore.Session, error) { return b.inner.CreateSession(ctx, s, now) })
}

// ResumeSession implements sessionstore.Store.
func (b *Store) ResumeSession(ctx context.Context, k sessionstore.Key, oldHash, newHash []byte, t sessionstore.Touch, now time.Time) (sessionstore.Session, error) {
	return guard(b, ctx, func() (sessionstore.Session, error) {
		return b.inner.ResumeSession(ctx, k, oldHash, newHash, t, now)
	})
}

// RetryRegistration implements sessionstore.Store.
func (b *Store) RetryRegistration(ctx context.Context, k sessionstore.Key, keyHash, apiKeyHash []byte, since time.Time, newHash []byte, t sessionstore.Touch, now time.Time) (sessionstore.Session, error) {
	return guard(b, ctx, func() (sessionstore.Session, error) {
		return b.inner.RetryRegistration(ctx, k, keyHash, apiKeyHash, since, newHash, t, now)
	})
}

// SpendRegistrationKey implements sessionstore.Store.
func (b *Store) SpendRegistrationKey(ctx context.Context, k sessionstore.Key, tokenHash []byte) error {
	return guardErr(b, ctx, func() error { return b.inner.SpendRegistrationKey(ctx, k, tokenHash) })
}

// SessionByToken implements sessionstore.Store.
func (b *Store) SessionByToken(ctx context.Context, h []byte, now time.Time) (sessionstore.Session, error) {
	return guard(b, ctx, func() (sessionstore.Session, error) { return b.inner.SessionByToken(ctx, h, now) })
}

// GetSession implements sessionstore.Store.
func (b *Store) GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error) {
	return guard(b, ctx, func() (sessionstore.Session, error) { return b.inner.GetSession(ctx, k, now) })
}

// SessionHeads implements sessionstore.Store.
func (b *Store) SessionHeads(ctx context.Context, keys []sessionstore.Key, now time.Time) (map[sessionstore.Key]sessionstore.SessionHead, error) {
	return guard(b, ctx, func() (map[sessionstore.Key]sessionstore.SessionHead, error) {
		return b.inner.SessionHeads(ctx, keys, now)
	})
}

// ListSessions implements sessionstore.Store.
func (b *Store) ListSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) ([]sessionstore.Session, error) {
	return guard(b, ctx, func() ([]sessionstore.Session, error) { return b.inner.ListSessions(ctx, f, now) })
}

// CountSessions implements sessionstore.Store.
func (b *Store) CountSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) (int, error) {
	return guard(b, ctx, func() (int, error) { return b.inner.CountSessions(ctx, f, now) })
}

// TouchSession implements sessionstore.Store.
func (b *Store) TouchSession(ctx context.Context, k sessionstore.Key, t sessionstore.Touch, now time.Time) error {
	return guardErr(b, ctx, func() error { return b.inner.TouchSession(ctx, k, t, now) })
}

// TouchSessionAs implements sessionstore.Store.
func (b *Store) TouchSessionAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, t sessionstore.Touch, now time.Time) error {
	return guardErr(b, ctx, func() error { return b.inner.TouchSessionAs(ctx, k, h, t, now) })
}

// DeleteSession implements sessionstore.Store.
func (b *Store) DeleteSession(ctx context.Context, k sessionstore.Key) error {
	return guardErr(b, ctx, func() error { return b.inner.DeleteSession(ctx, k) })
}

// SetQueue implements sessionstore.Store.
func (b *Store) SetQueue(ctx context.Context, k sessionstore.Key, instance string, at time.Time) error {
	return guardErr(b, ctx, func() error { return b.inner.SetQueue(ctx, k, instance, at) })
}

// AttachQueue implements sessionstore.Store.
func (b *Store) AttachQueue(ctx context.Context, k sessionstore.Key, instance string, at time.Time, t sessionstore.Touch, now time.Time) (int, error) {
	return guard(b, ctx, func() (int, error) { return b.inner.AttachQueue(ctx, k, instance, at, t, now) })
}

// ClearQueue implements sessionstore.Store.
func (b *Store) ClearQueue(ctx context.Context, k sessionstore.Key, instance string, attachedAt, at time.Time) (bool, error) {
	return guard(b, ctx, func() (bool, error) { return b.inner.ClearQueue(ctx, k, instance, attachedAt, at) })
}

// AssignInstance implements sessionstore.Store.
func (b *Store) AssignInstance(ctx context.Context, k sessionstore.Key, instance string) error {
	return guardErr(b, ctx, func() error { return b.inner.AssignInstance(ctx, k, instance) })
}

// ReassignInstance implements sessionstore.Store.
func (b *Store) ReassignInstance(ctx context.Context, k sessionstore.Key, from, to string) (bool, error) {
	return guard(b, ctx, func() (bool, error) { return b.inner.ReassignInstance(ctx, k, from, to) })
}

// PutAPIKey implements sessionstore.Store.
func (b *Store) PutAPIKey(ctx context.Context, k sessionstore.APIKey) error {
	return guardErr(b, ctx, func() error { return b.inner.PutAPIKey(ctx, k) })
}

// APIKeyByHash implements sessionstore.Store.
func (b *Store) APIKeyByHash(ctx context.Context, h []byte) (sessionstore.APIKey, error) {
	return guard(b, ctx, func() (sessionstore.APIKey, error) { return b.inner.APIKeyByHash(ctx, h) })
}

// DeleteAPIKey implements sessionstore.Store.
func (b *Store) DeleteAPIKey(ctx context.Context, h []byte) (sessionstore.APIKey, error) {
	return guard(b, ctx, func() (sessionstore.APIKey, error) { return b.inner.DeleteAPIKey(ctx, h) })
}

// AppendSignal implements sessionstore.Store.
func (b *Store) AppendSignal(ctx context.Context, s sessionstore.NewSignal, now time.Time) (sessionstore.Signal, bool, error) {
	type appended struct {
		sig sessionstore.Signal
		dup bool
	}
	r, err := guard(b, ctx, func() (appended, error) {
		sig, dup, err := b.inner.AppendSignal(ctx, s, now)
		return appended{sig, dup}, err
	})
	return r.sig, r.dup, err
}

// PendingSignals implements sessionstore.Store.
func (b *Store) PendingSignals(ctx context.Context, k sessionstore.Key, afterSeq int64, limit int) ([]sessionstore.Signal, error) {
	return guard(b, ctx, func() ([]sessionstore.Signal, error) { return b.inner.PendingSignals(ctx, k, afterSeq, limit) })
}

// AckSignals implements sessionstore.Store.
func (b *Store) AckSignals(ctx context.Context, k sessionstore.Key, upToSeq int64, at time.Time) (int, error) {
	return guard(b, ctx, func() (int, error) { return b.inner.AckSignals(ctx, k, upToSeq, at) })
}

// AckSignalsAs implements sessionstore.Store.
func (b *Store) AckSignalsAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upToSeq int64, at time.Time) (int, error) {
	return guard(b, ctx, func() (int, error) { return b.inner.AckSignalsAs(ctx, k, h, upToSeq, at) })
}

// CountPending implements sessionstore.Store.
func (b *Store) CountPending(ctx context.Context, k sessionstore.Key) (int, error) {
	return guard(b, ctx, func() (int, error) { return b.inner.CountPending(ctx, k) })
}

// PendingTotal implements sessionstore.Store.
func (b *Store) PendingTotal(ctx context.Context, now time.Time) (int, error) {
	return guard(b, ctx, func() (int, error) { return b.inner.PendingTotal(ctx, now) })
}

// DropPending implements sessionstore.Store.
func (b *Store) DropPending(ctx context.Context, k sessionstore.Key, at time.Time) (int, error) {
	return guard(b, ctx, func() (int, error) { return b.inner.DropPending(ctx, k, at) })
}

// Prune implements sessionstore.Store. A prune that runs out of its
// caller's budget (the retention loop's) does not open the breaker: its
// batches each finished under the store's own timeout, so the store answered
// and the backlog is simply long; the next run goes on. A batch that times
// out on its own, or a store that cannot be reached, opens it as usual.
func (b *Store) Prune(ctx context.Context, ackedMadeBefore, expiredBefore time.Time) (int, int, error) {
	if err := b.before(); err != nil {
		return 0, 0, err
	}
	sigs, sess, err := b.inner.Prune(ctx, ackedMadeBefore, expiredBefore)
	if err != nil && ctx.Err() != nil {
		return sigs, sess, err
	}
	return sigs, sess, b.after(ctx, err)
}

// HeartbeatInstance implements sessionstore.Store.
func (b *Store) HeartbeatInstance(ctx context.Context, in sessionstore.Instance) error {
	return guardErr(b, ctx, func() error { return b.inner.HeartbeatInstance(ctx, in) })
}

// SessionStats implements sessionstore.Store.
func (b *Store) SessionStats(ctx context.Context, now time.Time) (sessionstore.SessionStats, error) {
	return guard(b, ctx, func() (sessionstore.SessionStats, error) { return b.inner.SessionStats(ctx, now) })
}

// CountByClient implements sessionstore.Store.
func (b *Store) CountByClient(ctx context.Context, now time.Time, source marconi.ModeSource) (map[string]map[marconi.RuntimeMode]int, error) {
	return guard(b, ctx, func() (map[string]map[marconi.RuntimeMode]int, error) { return b.inner.CountByClient(ctx, now, source) })
}

// ListInstances implements sessionstore.Store.
func (b *Store) ListInstances(ctx context.Context) ([]sessionstore.Instance, error) {
	return guard(b, ctx, func() ([]sessionstore.Instance, error) { return b.inner.ListInstances(ctx) })
}

// RecordFallback implements sessionstore.Store.
func (b *Store) RecordFallback(ctx context.Context, e sessionstore.FallbackEvent) error {
	return guardErr(b, ctx, func() error { return b.inner.RecordFallback(ctx, e) })
}

// ListFallbacks implements sessionstore.Store.
func (b *Store) ListFallbacks(ctx context.Context, limit int) ([]sessionstore.FallbackEvent, error) {
	return guard(b, ctx, func() ([]sessionstore.FallbackEvent, error) { return b.inner.ListFallbacks(ctx, limit) })
}

// AddCount implements sessionstore.Store.
func (b *Store) AddCount(ctx context.Context, c sessionstore.Counter, n int64) error {
	return guardErr(b, ctx, func() error { return b.inner.AddCount(ctx, c, n) })
}

// Counts implements sessionstore.Store.
func (b *Store) Counts(ctx context.Context) (sessionstore.Counts, error) {
	return guard(b, ctx, func() (sessionstore.Counts, error) { return b.inner.Counts(ctx) })
}
