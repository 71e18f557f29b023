package memstore

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// MaxFallbackEvents is how many fallback events the store keeps: the most
// recently recorded ones. Counts.Fallbacks still counts every event.
const MaxFallbackEvents = sessionstore.KeepFallbackEvents

var _ sessionstore.Store = (*Store)(nil)

// Store is an in-memory sessionstore.Store. Nothing is durable and it serves
// one hub instance only. It is safe for concurrent use: one mutex guards
// everything. Times are kept truncated to the microsecond, as Postgres keeps
// them, so that both stores answer alike. Byte slices and payloads are copied
// in and out, so callers never share the store's memory.
//
// The hot lookups cost what they return, not what is stored: an idempotency
// lookup reads an index, and a session's pending signals are the tail of its
// signal slice (see session).
type Store struct {
	mu       sync.Mutex
	closed   bool
	sessions map[sessionstore.Key]*session
	byToken  map[string]sessionstore.Key // token hash -> key, for every stored session
	// byProject holds every stored session by its project (the key with
	// SessionID empty), so that counting a project's sessions (its quota)
	// costs that project's size, not the store's.
	byProject map[sessionstore.Key]map[sessionstore.Key]*session
	// idem holds every stored signal that has an idempotency key, by sender
	// and key, in append order: usually one. A signal is in it exactly as
	// long as it is in its session's signals.
	idem map[idemKey][]*signal
	// projectBytes is the payload bytes of the pending signals of every
	// stored session (expired ones too, until pruned), by project: the
	// pending-bytes quota reads it instead of summing.
	projectBytes map[projectKey]int64
	apiKeys      map[string]sessionstore.APIKey
	instances    map[string]sessionstore.Instance
	fallbacks    []sessionstore.FallbackEvent // in recording order, at most MaxFallbackEvents
	counts       sessionstore.Counts
}

// session is a stored session with the signals addressed to it.
//
// Acknowledged signals are always a prefix of signals: every ack (AckSignals,
// DropPending) acknowledges all signals up to a seq, an append adds a pending
// signal at the end, and Prune removes acknowledged signals only. So
// signals[:acked] are acknowledged and signals[acked:] are pending.
type session struct {
	s       sessionstore.Session
	lastSeq int64     // last seq given out; survives pruning
	signals []*signal // ascending seq
	acked   int       // how many of signals, from the front, are acknowledged
	// latestAttach is the newest attach SetQueue recorded, kept after the
	// queue detaches (the compare of SetQueue).
	latestAttach time.Time
	pendingBytes int64 // payload bytes of pending()
}

// pending returns the unacknowledged signals of s, in seq order.
func (s *session) pending() []*signal { return s.signals[s.acked:] }

// idemKey names the signals one sender sent with one idempotency key, within
// a tenant and project (the recipient is not part of it).
type idemKey struct {
	tenantID, projectID, fromSession, key string
}

func idemKeyOf(sig sessionstore.Signal) idemKey {
	return idemKey{sig.To.TenantID, sig.To.ProjectID, sig.FromSession, sig.IdempotencyKey}
}

// projectKey names a (tenant, project).
type projectKey struct{ tenantID, projectID string }

// addProjectBytes moves the pending bytes of k's project by n, forgetting a
// project that has none. The caller holds the mutex.
func (m *Store) addProjectBytes(k sessionstore.Key, n int64) {
	if n == 0 {
		return
	}
	pk := projectKey{k.TenantID, k.ProjectID}
	if v := m.projectBytes[pk] + n; v != 0 {
		m.projectBytes[pk] = v
	} else {
		delete(m.projectBytes, pk)
	}
}

type signal struct {
	sig     sessionstore.Signal
	ackedAt time.Time // zero while pending
}

// New returns an empty store.
func New() *Store {
	return &Store{
		sessions:  make(map[sessionstore.Key]*session),
		byToken:   make(map[string]sessionstore.Key),
		byProject: make(map[sessionstore.Key]map[sessionstore.Key]*session),
		apiKeys:   make(map[string]sessionstore.APIKey),
		instances: make(map[string]sessionstore.Instance),
		idem:      make(map[idemKey][]*signal),

		projectBytes: make(map[projectKey]int64),
	}
}

var errClosed = fmt.Errorf("memstore: closed: %w", sessionstore.ErrUnavailable)

// lock takes the mutex, or reports the store closed. On nil the caller must unlock.
func (m *Store) lock() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errClosed
	}
	return nil
}

// storable refuses what Postgres text cannot hold (a NUL byte, invalid
// UTF-8), so that both stores answer alike.
func storable(values ...string) error {
	for _, v := range values {
		if strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v) {
			return fmt.Errorf("memstore: %q cannot be stored as text: %w", v, sessionstore.ErrInvalidInput)
		}
	}
	return nil
}

// ts truncates a time to the microsecond and drops its monotonic reading.
func ts(t time.Time) time.Time { return t.Truncate(time.Microsecond) }

// live reports whether a session is live at now: it expired only when its
// expiry is before now.
func live(s *session, now time.Time) bool { return !s.s.ExpiresAt.Before(now) }

func cloneSession(s sessionstore.Session) sessionstore.Session {
	s.TokenHash = bytes.Clone(s.TokenHash)
	s.RegistrationKeyHash = bytes.Clone(s.RegistrationKeyHash)
	s.RegistrationAPIKeyHash = bytes.Clone(s.RegistrationAPIKeyHash)
	return s
}

func cloneSignal(s sessionstore.Signal) sessionstore.Signal {
	s.Payload = bytes.Clone(s.Payload)
	return s
}

// later returns the later of cur and t; a zero t leaves cur alone.
func later(cur, t time.Time) time.Time {
	if t.IsZero() || !t.After(cur) {
		return cur
	}
	return ts(t)
}

// Ping always succeeds while the store is open.
func (m *Store) Ping(ctx context.Context) error {
	if err := m.lock(); err != nil {
		return err
	}
	m.mu.Unlock()
	return nil
}

// Close makes every later call return sessionstore.ErrUnavailable. Closing
// twice is harmless.
func (m *Store) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// CreateSession implements sessionstore.Store.
func (m *Store) CreateSession(ctx context.Context, s sessionstore.Session, now time.Time) (sessionstore.Session, error) {
	if err := m.lock(); err != nil {
		return sessionstore.Session{}, err
	}
	defer m.mu.Unlock()
	if err := storable(s.TenantID, s.ProjectID, s.SessionID, string(s.Surface), string(s.RuntimeMode), string(s.RuntimeModeSource),
		s.ClientID, s.AssignedInstance, s.QueueInstance); err != nil {
		return sessionstore.Session{}, err
	}
	old, exists := m.sessions[s.Key]
	if exists && live(old, now) {
		return sessionstore.Session{}, fmt.Errorf("memstore: session %v is live: %w", s.Key, sessionstore.ErrConflict)
	}
	if holder, ok := m.byToken[string(s.TokenHash)]; ok && !(exists && holder == s.Key) {
		return sessionstore.Session{}, fmt.Errorf("memstore: token hash in use: %w", sessionstore.ErrConflict)
	}
	if exists {
		m.remove(s.Key)
	}
	s = cloneSession(s)
	s.RegisteredAt = ts(s.RegisteredAt)
	s.LastSeenAt = ts(s.LastSeenAt)
	s.LastVerbAt = ts(s.LastVerbAt)
	s.ExpiresAt = ts(s.ExpiresAt)
	s.QueueAttachedAt = ts(s.QueueAttachedAt)
	s.QueueDetachedAt = ts(s.QueueDetachedAt)
	m.sessions[s.Key] = &session{s: s, latestAttach: s.QueueAttachedAt}
	m.byToken[string(s.TokenHash)] = s.Key
	m.indexProject(m.sessions[s.Key])
	return cloneSession(s), nil
}

// remove deletes a session with its signals. The caller holds the mutex.
func (m *Store) remove(k sessionstore.Key) {
	if s, ok := m.sessions[k]; ok {
		for _, sg := range s.signals {
			m.unindex(sg)
		}
		m.addProjectBytes(k, -s.pendingBytes)
		delete(m.byToken, string(s.s.TokenHash))
		delete(m.sessions, k)
		m.unindexProject(k)
	}
}

func projectOf(k sessionstore.Key) sessionstore.Key {
	return sessionstore.Key{TenantID: k.TenantID, ProjectID: k.ProjectID}
}

// indexProject adds s to byProject. The caller holds the mutex.
func (m *Store) indexProject(s *session) {
	p := projectOf(s.s.Key)
	if m.byProject[p] == nil {
		m.byProject[p] = make(map[sessionstore.Key]*session)
	}
	m.byProject[p][s.s.Key] = s
}

// unindexProject removes k from byProject, and its project once empty.
// The caller holds the mutex.
func (m *Store) unindexProject(k sessionstore.Key) {
	p := projectOf(k)
	delete(m.byProject[p], k)
	if len(m.byProject[p]) == 0 {
		delete(m.byProject, p)
	}
}

// index adds a newly stored signal to the idempotency index. The caller
// holds the mutex.
func (m *Store) index(sg *signal) {
	if sg.sig.IdempotencyKey == "" {
		return
	}
	ik := idemKeyOf(sg.sig)
	m.idem[ik] = append(m.idem[ik], sg)
}

// unindex removes a signal that is being deleted from the idempotency
// index. The caller holds the mutex.
func (m *Store) unindex(sg *signal) {
	if sg.sig.IdempotencyKey == "" {
		return
	}
	ik := idemKeyOf(sg.sig)
	rest := slices.DeleteFunc(m.idem[ik], func(o *signal) bool { return o == sg })
	if len(rest) == 0 {
		delete(m.idem, ik)
	} else {
		m.idem[ik] = rest
	}
}

// liveSession returns the live session with key k, or ErrNotFound. The
// caller holds the mutex.
func (m *Store) liveSession(k sessionstore.Key, now time.Time) (*session, error) {
	s, ok := m.sessions[k]
	if !ok || !live(s, now) {
		return nil, fmt.Errorf("memstore: session %v: %w", k, sessionstore.ErrNotFound)
	}
	return s, nil
}

// anySession returns the stored session with key k, live or not, or ErrNotFound.
func (m *Store) anySession(k sessionstore.Key) (*session, error) {
	s, ok := m.sessions[k]
	if !ok {
		return nil, fmt.Errorf("memstore: session %v: %w", k, sessionstore.ErrNotFound)
	}
	return s, nil
}

func (s *session) touch(t sessionstore.Touch) {
	s.s.LastSeenAt = later(s.s.LastSeenAt, t.SeenAt)
	s.s.LastVerbAt = later(s.s.LastVerbAt, t.VerbAt)
	s.s.ExpiresAt = later(s.s.ExpiresAt, t.ExpiresAt)
}

// ResumeSession implements sessionstore.Store. A new hash held by another
// session is ErrConflict.
func (m *Store) ResumeSession(ctx context.Context, k sessionstore.Key, oldHash, newHash []byte, t sessionstore.Touch, now time.Time) (sessionstore.Session, error) {
	if err := m.lock(); err != nil {
		return sessionstore.Session{}, err
	}
	defer m.mu.Unlock()
	s, err := m.liveSession(k, now)
	if err != nil {
		return sessionstore.Session{}, err
	}
	if !bytes.Equal(s.s.TokenHash, oldHash) {
		return sessionstore.Session{}, fmt.Errorf("memstore: resume %v: %w", k, sessionstore.ErrTokenMismatch)
	}
	if err := m.swapToken(s, newHash, t); err != nil {
		return sessionstore.Session{}, err
	}
	s.s.RegistrationKeyHash, s.s.RegistrationAPIKeyHash = nil, nil
	return cloneSession(s.s), nil
}

// RetryRegistration implements sessionstore.Store.
func (m *Store) RetryRegistration(ctx context.Context, k sessionstore.Key, keyHash, apiKeyHash []byte, since time.Time, newHash []byte, t sessionstore.Touch, now time.Time) (sessionstore.Session, error) {
	if err := m.lock(); err != nil {
		return sessionstore.Session{}, err
	}
	defer m.mu.Unlock()
	s, err := m.liveSession(k, now)
	if err != nil {
		return sessionstore.Session{}, err
	}
	if len(keyHash) == 0 || len(apiKeyHash) == 0 || !bytes.Equal(s.s.RegistrationKeyHash, keyHash) ||
		!bytes.Equal(s.s.RegistrationAPIKeyHash, apiKeyHash) || s.s.RegisteredAt.Before(since) {
		return sessionstore.Session{}, fmt.Errorf("memstore: retry registration %v: %w", k, sessionstore.ErrNotFound)
	}
	if err := m.swapToken(s, newHash, t); err != nil {
		return sessionstore.Session{}, err
	}
	return cloneSession(s.s), nil
}

// SpendRegistrationKey implements sessionstore.Store.
func (m *Store) SpendRegistrationKey(ctx context.Context, k sessionstore.Key, tokenHash []byte) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if s, ok := m.sessions[k]; ok && bytes.Equal(s.s.TokenHash, tokenHash) {
		s.s.RegistrationKeyHash, s.s.RegistrationAPIKeyHash = nil, nil
	}
	return nil
}

// swapToken gives s the token hash newHash and applies t. A hash held by
// another session is ErrConflict. The caller holds the mutex.
func (m *Store) swapToken(s *session, newHash []byte, t sessionstore.Touch) error {
	if holder, ok := m.byToken[string(newHash)]; ok && holder != s.s.Key {
		return fmt.Errorf("memstore: token hash in use: %w", sessionstore.ErrConflict)
	}
	delete(m.byToken, string(s.s.TokenHash))
	s.s.TokenHash = bytes.Clone(newHash)
	m.byToken[string(newHash)] = s.s.Key
	s.touch(t)
	return nil
}

// SessionByToken implements sessionstore.Store.
func (m *Store) SessionByToken(ctx context.Context, h []byte, now time.Time) (sessionstore.Session, error) {
	if err := m.lock(); err != nil {
		return sessionstore.Session{}, err
	}
	defer m.mu.Unlock()
	k, ok := m.byToken[string(h)]
	if !ok {
		return sessionstore.Session{}, fmt.Errorf("memstore: session by token: %w", sessionstore.ErrNotFound)
	}
	s, err := m.liveSession(k, now)
	if err != nil {
		return sessionstore.Session{}, err
	}
	return cloneSession(s.s), nil
}

// GetSession implements sessionstore.Store.
func (m *Store) GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error) {
	if err := m.lock(); err != nil {
		return sessionstore.Session{}, err
	}
	defer m.mu.Unlock()
	s, err := m.liveSession(k, now)
	if err != nil {
		return sessionstore.Session{}, err
	}
	return cloneSession(s.s), nil
}

// SessionHeads implements sessionstore.Store.
func (m *Store) SessionHeads(ctx context.Context, keys []sessionstore.Key, now time.Time) (map[sessionstore.Key]sessionstore.SessionHead, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := make(map[sessionstore.Key]sessionstore.SessionHead, len(keys))
	for _, k := range keys {
		s, ok := m.sessions[k]
		if !ok || !live(s, now) {
			continue
		}
		// Pending signals are the tail of signals, gap-free up to lastSeq.
		out[k] = sessionstore.SessionHead{Session: cloneSession(s.s), LastSeq: s.lastSeq, AckedSeq: s.lastSeq - int64(len(s.pending()))}
	}
	return out, nil
}

// ListSessions implements sessionstore.Store.
func (m *Store) ListSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) ([]sessionstore.Session, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	var out []sessionstore.Session
	for k, s := range m.sessions {
		if (f.TenantID != "" && k.TenantID != f.TenantID) ||
			(f.ProjectID != "" && k.ProjectID != f.ProjectID) || !live(s, now) {
			continue
		}
		out = append(out, cloneSession(s.s))
	}
	slices.SortFunc(out, func(a, b sessionstore.Session) int {
		return cmp.Or(cmp.Compare(a.TenantID, b.TenantID), cmp.Compare(a.ProjectID, b.ProjectID),
			cmp.Compare(a.SessionID, b.SessionID))
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// CountSessions implements sessionstore.Store. For one project it reads that
// project's sessions only; otherwise it scans every session.
func (m *Store) CountSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) (int, error) {
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	scan := m.sessions
	if f.TenantID != "" && f.ProjectID != "" {
		scan = m.byProject[sessionstore.Key{TenantID: f.TenantID, ProjectID: f.ProjectID}]
	}
	n := 0
	for k, s := range scan {
		if (f.TenantID != "" && k.TenantID != f.TenantID) ||
			(f.ProjectID != "" && k.ProjectID != f.ProjectID) || !live(s, now) {
			continue
		}
		if n++; f.Limit > 0 && n == f.Limit {
			break
		}
	}
	return n, nil
}

// SessionStats implements sessionstore.Store.
func (m *Store) SessionStats(ctx context.Context, now time.Time) (sessionstore.SessionStats, error) {
	if err := m.lock(); err != nil {
		return sessionstore.SessionStats{}, err
	}
	defer m.mu.Unlock()
	out := sessionstore.SessionStats{
		ByMode: map[marconi.RuntimeMode]int{}, BySource: map[marconi.ModeSource]int{},
		ByAssignedInstance: map[string]int{}, ByQueueInstance: map[string]int{},
	}
	for _, s := range m.sessions {
		if !live(s, now) {
			continue
		}
		out.Total++
		out.ByMode[s.s.RuntimeMode]++
		out.BySource[s.s.RuntimeModeSource]++
		if s.s.AssignedInstance != "" {
			out.ByAssignedInstance[s.s.AssignedInstance]++
		}
		if s.s.QueueInstance != "" {
			out.ByQueueInstance[s.s.QueueInstance]++
		}
	}
	return out, nil
}

// CountByClient implements sessionstore.Store.
func (m *Store) CountByClient(ctx context.Context, now time.Time, source marconi.ModeSource) (map[string]map[marconi.RuntimeMode]int, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := map[string]map[marconi.RuntimeMode]int{}
	for _, s := range m.sessions {
		if !live(s, now) || s.s.RuntimeModeSource != source {
			continue
		}
		if out[s.s.ClientID] == nil {
			out[s.s.ClientID] = map[marconi.RuntimeMode]int{}
		}
		out[s.s.ClientID][s.s.RuntimeMode]++
	}
	return out, nil
}

// TouchSession implements sessionstore.Store.
func (m *Store) TouchSession(ctx context.Context, k sessionstore.Key, t sessionstore.Touch, now time.Time) error {
	return m.touchAs(k, nil, t, now)
}

// TouchSessionAs implements sessionstore.Store.
func (m *Store) TouchSessionAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, t sessionstore.Touch, now time.Time) error {
	return m.touchAs(k, &h, t, now)
}

// touchAs applies t to the live session k, when h is set only while h
// holds it (TouchSessionAs).
func (m *Store) touchAs(k sessionstore.Key, h *sessionstore.Holder, t sessionstore.Touch, now time.Time) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	s, err := m.liveSession(k, now)
	if err != nil {
		return err
	}
	if h != nil && (!s.s.RegisteredAt.Equal(h.RegisteredAt) || (len(s.s.TokenHash) > 0 && !bytes.Equal(s.s.TokenHash, h.TokenHash))) {
		return fmt.Errorf("memstore: session %v is no longer the caller's: %w", k, sessionstore.ErrNotFound)
	}
	s.touch(t)
	return nil
}

// DeleteSession implements sessionstore.Store.
func (m *Store) DeleteSession(ctx context.Context, k sessionstore.Key) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if _, err := m.anySession(k); err != nil {
		return err
	}
	m.remove(k)
	return nil
}

// SetQueue implements sessionstore.Store: a compare-and-set on the
// attachment (see the interface).
func (m *Store) SetQueue(ctx context.Context, k sessionstore.Key, instance string, at time.Time) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	s, err := m.anySession(k)
	if err != nil {
		return err
	}
	s.setQueue(instance, at)
	return nil
}

// setQueue is SetQueue's compare-and-set on s.
func (s *session) setQueue(instance string, at time.Time) {
	at = ts(at)
	if s.latestAttach.After(at) || (s.latestAttach.Equal(at) && s.s.QueueInstance == "") {
		return // a newer attach won, or this one was already cleared
	}
	s.s.QueueInstance = instance
	s.s.QueueAttachedAt = at
	s.latestAttach = at
}

// AttachQueue implements sessionstore.Store: SetQueue, TouchSession and
// CountPending under one lock.
func (m *Store) AttachQueue(ctx context.Context, k sessionstore.Key, instance string, at time.Time, t sessionstore.Touch, now time.Time) (int, error) {
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	s, err := m.liveSession(k, now)
	if err != nil {
		return 0, err
	}
	s.setQueue(instance, at)
	s.touch(t)
	return len(s.pending()), nil
}

// ClearQueue implements sessionstore.Store. An unknown key clears nothing.
func (m *Store) ClearQueue(ctx context.Context, k sessionstore.Key, instance string, attachedAt, at time.Time) (bool, error) {
	if err := m.lock(); err != nil {
		return false, err
	}
	defer m.mu.Unlock()
	s, ok := m.sessions[k]
	if !ok || s.s.QueueInstance == "" || s.s.QueueInstance != instance || !s.s.QueueAttachedAt.Equal(ts(attachedAt)) {
		return false, nil
	}
	s.s.QueueInstance = ""
	s.s.QueueAttachedAt = time.Time{}
	s.s.QueueDetachedAt = ts(at)
	return true, nil
}

// AssignInstance implements sessionstore.Store.
func (m *Store) AssignInstance(ctx context.Context, k sessionstore.Key, instance string) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	s, err := m.anySession(k)
	if err != nil {
		return err
	}
	s.s.AssignedInstance = instance
	return nil
}

// ReassignInstance implements sessionstore.Store.
func (m *Store) ReassignInstance(ctx context.Context, k sessionstore.Key, from, to string) (bool, error) {
	if err := m.lock(); err != nil {
		return false, err
	}
	defer m.mu.Unlock()
	s, err := m.anySession(k)
	if err != nil {
		return false, err
	}
	if s.s.AssignedInstance != from {
		return false, nil
	}
	s.s.AssignedInstance = to
	return true, nil
}

// PutAPIKey implements sessionstore.Store.
func (m *Store) PutAPIKey(ctx context.Context, k sessionstore.APIKey) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if _, ok := m.apiKeys[string(k.Hash)]; ok {
		return fmt.Errorf("memstore: api key: %w", sessionstore.ErrConflict)
	}
	k.Hash = bytes.Clone(k.Hash)
	k.CreatedAt = ts(k.CreatedAt)
	m.apiKeys[string(k.Hash)] = k
	return nil
}

// APIKeyByHash implements sessionstore.Store.
func (m *Store) APIKeyByHash(ctx context.Context, h []byte) (sessionstore.APIKey, error) {
	if err := m.lock(); err != nil {
		return sessionstore.APIKey{}, err
	}
	defer m.mu.Unlock()
	k, ok := m.apiKeys[string(h)]
	if !ok {
		return sessionstore.APIKey{}, fmt.Errorf("memstore: api key: %w", sessionstore.ErrNotFound)
	}
	k.Hash = bytes.Clone(k.Hash)
	return k, nil
}

// DeleteAPIKey implements sessionstore.Store.
func (m *Store) DeleteAPIKey(ctx context.Context, h []byte) (sessionstore.APIKey, error) {
	if err := m.lock(); err != nil {
		return sessionstore.APIKey{}, err
	}
	defer m.mu.Unlock()
	k, ok := m.apiKeys[string(h)]
	if !ok {
		return sessionstore.APIKey{}, fmt.Errorf("memstore: delete api key: %w", sessionstore.ErrNotFound)
	}
	delete(m.apiKeys, string(h))
	return k, nil
}

// AppendSignal implements sessionstore.Store.
func (m *Store) AppendSignal(ctx context.Context, ns sessionstore.NewSignal, now time.Time) (sessionstore.Signal, bool, error) {
	if err := m.lock(); err != nil {
		return sessionstore.Signal{}, false, err
	}
	defer m.mu.Unlock()
	if err := storable(ns.ID, ns.FromSession, ns.Kind, ns.IdempotencyKey, string(ns.Delivery), string(ns.RouteState)); err != nil {
		return sessionstore.Signal{}, false, err
	}
	if ns.SenderTokenHash != nil {
		from, ok := m.sessions[sessionstore.Key{TenantID: ns.To.TenantID, ProjectID: ns.To.ProjectID, SessionID: ns.FromSession}]
		if !ok || !live(from, now) || !bytes.Equal(from.s.TokenHash, ns.SenderTokenHash) {
			return sessionstore.Signal{}, false, fmt.Errorf("memstore: sender token: %w", sessionstore.ErrTokenMismatch)
		}
	}
	to, err := m.liveSession(ns.To, now)
	if err != nil {
		return sessionstore.Signal{}, false, err
	}
	if ns.IdempotencyKey != "" {
		if dup := m.findIdempotent(ns); dup != nil {
			return cloneSignal(dup.sig), true, nil
		}
	}
	if seen := ns.Seen; seen != nil && (!to.s.RegisteredAt.Equal(seen.RegisteredAt) || !bytes.Equal(to.s.TokenHash, seen.TokenHash) ||
		to.s.QueueInstance != seen.QueueInstance || !to.s.QueueAttachedAt.Equal(seen.QueueAttachedAt)) {
		return sessionstore.Signal{}, false, sessionstore.ErrRecipientChanged
	}
	if err := m.checkLimits(to, ns); err != nil {
		return sessionstore.Signal{}, false, err
	}
	to.lastSeq++
	to.pendingBytes += int64(len(ns.Payload))
	m.addProjectBytes(ns.To, int64(len(ns.Payload)))
	sig := sessionstore.Signal{
		ID:             ns.ID,
		Seq:            to.lastSeq,
		To:             ns.To,
		FromSession:    ns.FromSession,
		Kind:           ns.Kind,
		Payload:        bytes.Clone(ns.Payload),
		CreatedAt:      ts(ns.CreatedAt),
		IdempotencyKey: ns.IdempotencyKey,
		Delivery:       ns.Delivery,
		RouteState:     ns.RouteState,
	}
	sg := &signal{sig: sig}
	to.signals = append(to.signals, sg)
	m.index(sg)
	return cloneSignal(sig), false, nil
}

// checkLimits returns the *QuotaError of an append of ns to to that its
// limits refuse, or nil. The caller holds the mutex.
func (m *Store) checkLimits(to *session, ns sessionstore.NewSignal) error {
	l := ns.Limits
	if n := int64(len(to.pending())); l.PendingPerRecipient > 0 && n >= l.PendingPerRecipient {
		return &sessionstore.QuotaError{Quota: marconi.QuotaPendingPerRecipient, Limit: l.PendingPerRecipient, Current: n}
	}
	b := m.projectBytes[projectKey{ns.To.TenantID, ns.To.ProjectID}]
	if l.PendingBytesPerProject > 0 && b+int64(len(ns.Payload)) > l.PendingBytesPerProject {
		return &sessionstore.QuotaError{Quota: marconi.QuotaPendingBytesPerProject, Limit: l.PendingBytesPerProject, Current: b}
	}
	return nil
}

// findIdempotent returns the newest stored signal from ns's sender with ns's
// idempotency key created at or after ns.IdempotencySince, or nil; among
// equal CreatedAt, the later appended. The caller holds the mutex.
func (m *Store) findIdempotent(ns sessionstore.NewSignal) *signal {
	since := ts(ns.IdempotencySince)
	var found *signal
	for _, sg := range m.idem[idemKey{ns.To.TenantID, ns.To.ProjectID, ns.FromSession, ns.IdempotencyKey}] {
		if !sg.sig.CreatedAt.Before(since) && (found == nil || !sg.sig.CreatedAt.Before(found.sig.CreatedAt)) {
			found = sg
		}
	}
	return found
}

// PendingSignals implements sessionstore.Store. A limit of 0 or less means no limit.
func (m *Store) PendingSignals(ctx context.Context, k sessionstore.Key, afterSeq int64, limit int) ([]sessionstore.Signal, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	s, ok := m.sessions[k]
	if !ok {
		return nil, nil
	}
	// Seqs ascend: start at the first above afterSeq.
	pending := s.pending()
	from, _ := slices.BinarySearchFunc(pending, afterSeq+1, func(sg *signal, seq int64) int {
		return cmp.Compare(sg.sig.Seq, seq)
	})
	pending = pending[from:]
	if limit > 0 && len(pending) > limit {
		pending = pending[:limit]
	}
	if len(pending) == 0 {
		return nil, nil
	}
	out := make([]sessionstore.Signal, len(pending))
	for i, sg := range pending {
		out[i] = cloneSignal(sg.sig)
	}
	return out, nil
}

// AckSignals implements sessionstore.Store.
func (m *Store) AckSignals(ctx context.Context, k sessionstore.Key, upToSeq int64, at time.Time) (int, error) {
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	return m.ack(k, upToSeq, at), nil
}

// AckSignalsAs implements sessionstore.Store.
func (m *Store) AckSignalsAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upToSeq int64, at time.Time) (int, error) {
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	s, ok := m.sessions[k]
	switch {
	case !ok || !live(s, at) || !s.s.RegisteredAt.Equal(h.RegisteredAt):
		return 0, sessionstore.ErrNotFound
	case len(s.s.TokenHash) > 0 && !bytes.Equal(s.s.TokenHash, h.TokenHash):
		return 0, sessionstore.ErrTokenMismatch
	}
	return m.ack(k, upToSeq, at), nil
}

// ack acknowledges the pending signals of k up to upToSeq. The caller holds the mutex.
func (m *Store) ack(k sessionstore.Key, upToSeq int64, at time.Time) int {
	s, ok := m.sessions[k]
	if !ok {
		return 0
	}
	n := 0
	for _, sg := range s.pending() {
		if sg.sig.Seq > upToSeq {
			break
		}
		sg.ackedAt = ts(at)
		s.pendingBytes -= int64(len(sg.sig.Payload))
		m.addProjectBytes(k, -int64(len(sg.sig.Payload)))
		// Never delivered again: only its id, seq and answer stay, for a
		// duplicate send until Prune (sessionstore.Store.AckSignals).
		sg.sig.Payload = nil
		n++
	}
	s.acked += n
	return n
}

// CountPending implements sessionstore.Store.
func (m *Store) CountPending(ctx context.Context, k sessionstore.Key) (int, error) {
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	s, ok := m.sessions[k]
	if !ok {
		return 0, nil
	}
	return len(s.pending()), nil
}

// PendingTotal implements sessionstore.Store.
func (m *Store) PendingTotal(ctx context.Context, now time.Time) (int, error) {
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	n := 0
	for _, s := range m.sessions {
		if live(s, now) {
			n += len(s.pending())
		}
	}
	return n, nil
}

// DropPending implements sessionstore.Store.
func (m *Store) DropPending(ctx context.Context, k sessionstore.Key, at time.Time) (int, error) {
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	s, ok := m.sessions[k]
	if !ok || len(s.signals) == 0 {
		return 0, nil
	}
	return m.ack(k, s.lastSeq, at), nil
}

// Prune implements sessionstore.Store. The signals count is the acknowledged
// signals removed; the signals of a removed session are not counted. It
// works in one go: a memstore holds nothing a timeout would cut short.
func (m *Store) Prune(ctx context.Context, ackedMadeBefore, expiredBefore time.Time) (int, int, error) {
	if err := m.lock(); err != nil {
		return 0, 0, err
	}
	defer m.mu.Unlock()
	ackedMadeBefore, expiredBefore = ts(ackedMadeBefore), ts(expiredBefore)
	nsig, nsess := 0, 0
	for k, s := range m.sessions {
		// Only acknowledged signals go, and they are the first s.acked.
		before := len(s.signals)
		s.signals = slices.DeleteFunc(s.signals, func(sg *signal) bool {
			if sg.ackedAt.IsZero() || !sg.sig.CreatedAt.Before(ackedMadeBefore) {
				return false
			}
			m.unindex(sg)
			return true
		})
		nsig += before - len(s.signals)
		s.acked -= before - len(s.signals)
		if s.s.ExpiresAt.Before(expiredBefore) {
			m.remove(k)
			nsess++
		}
	}
	for id, in := range m.instances {
		if in.LastHeartbeatAt.Before(expiredBefore) {
			delete(m.instances, id)
		}
	}
	return nsig, nsess, nil
}

// HeartbeatInstance implements sessionstore.Store.
func (m *Store) HeartbeatInstance(ctx context.Context, in sessionstore.Instance) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	in.StartedAt = ts(in.StartedAt)
	in.LastHeartbeatAt = ts(in.LastHeartbeatAt)
	m.instances[in.ID] = in
	return nil
}

// ListInstances implements sessionstore.Store.
func (m *Store) ListInstances(ctx context.Context) ([]sessionstore.Instance, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := make([]sessionstore.Instance, 0, len(m.instances))
	for _, in := range m.instances {
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b sessionstore.Instance) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// RecordFallback implements sessionstore.Store. Only the last
// MaxFallbackEvents recorded events are kept.
func (m *Store) RecordFallback(ctx context.Context, e sessionstore.FallbackEvent) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	c := cmp.Or(e.Counter, sessionstore.CounterFallbacks)
	if err := m.add(c, 0); err != nil {
		return err
	}
	e.At = ts(e.At)
	e.Counter = ""
	m.fallbacks = append(m.fallbacks, e)
	if len(m.fallbacks) > MaxFallbackEvents {
		m.fallbacks = slices.Delete(m.fallbacks, 0, 1)
	}
	return m.add(c, 1)
}

// ListFallbacks implements sessionstore.Store: newest At first, the later
// recorded first among equal times. A limit of 0 or less means no limit.
func (m *Store) ListFallbacks(ctx context.Context, limit int) ([]sessionstore.FallbackEvent, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := slices.Clone(m.fallbacks)
	slices.Reverse(out)
	slices.SortStableFunc(out, func(a, b sessionstore.FallbackEvent) int { return b.At.Compare(a.At) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// AddCount implements sessionstore.Store. An unknown counter is an error.
func (m *Store) AddCount(ctx context.Context, c sessionstore.Counter, n int64) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	return m.add(c, n)
}

// add adds n to counter c. m.mu is held.
func (m *Store) add(c sessionstore.Counter, n int64) error {
	switch c {
	case sessionstore.CounterFallbacks:
		m.counts.Fallbacks += n
	case sessionstore.CounterReassignments:
		m.counts.Reassignments += n
	case sessionstore.CounterAdaptivePlacements:
		m.counts.AdaptivePlacements += n
	case sessionstore.CounterAdaptivePlacementMismatches:
		m.counts.AdaptivePlacementMismatches += n
	default:
		return fmt.Errorf("memstore: unknown counter %q", c)
	}
	return nil
}

// Counts implements sessionstore.Store.
func (m *Store) Counts(ctx context.Context) (sessionstore.Counts, error) {
	if err := m.lock(); err != nil {
		return sessionstore.Counts{}, err
	}
	defer m.mu.Unlock()
	return m.counts, nil
}
