package sessionstore

import (
	"context"
	"encoding/json"
	"time"

	"github.com/marconihub/marconi"
)

// Key names one session. Session ids are unique within a (tenant, project):
// two tenants may both have a session called "alice" and never see each other.
type Key struct {
	TenantID  string
	ProjectID string
	SessionID string
}

// Holder names who speaks for a session: one registration of it (its
// RegisteredAt, the incarnation) and the hash of the token the caller
// presented. A WebSocket's acks carry it, so that the store checks, in the
// ack's own write, that the connection still speaks for its session.
type Holder struct {
	RegisteredAt time.Time
	TokenHash    []byte
	// History is the store's history (Historian) the holder's connection
	// was last caught up under; 0 checks nothing. An ack made under an
	// earlier history than the store's is refused (ErrHistoryChanged): its
	// seqs may name signals the client never received.
	History uint64
}

// Historian is a store that knows when its data may have gone back in
// time: its server's history changed (a standby promoted, a restore to a
// point in time, another cluster behind the same address). A promoted
// standby that was replicated asynchronously may lack the last commits of
// the primary it replaces: signals answered 200 are gone, and the seqs they
// took are taken again by the recipients' next signals, which clients and
// connections that saw the lost ones would take for signals already
// delivered.
type Historian interface {
	// HistoryToken returns the store's history: n numbers the server
	// histories the store has seen, from 1 at its first connection (0 when
	// none is known yet; it only grows), and token names the current one,
	// an opaque string that every instance reaching the same server history
	// computes alike, so clients can compare what they were told by any of
	// them ("" while none is known).
	HistoryToken() (n uint64, token string)
}

// SessionHead is a session's row with how far its signals go: what the
// pending sweep needs to reconcile a connection and to tell whether it has
// anything to write.
type SessionHead struct {
	Session
	// LastSeq is the seq of the session's latest signal, 0 when none.
	LastSeq int64
	// AckedSeq is the session's highest acknowledged seq: its pending
	// signals are those with seq in (AckedSeq, LastSeq].
	AckedSeq int64
}

// Session is one registered agent session as the store keeps it.
type Session struct {
	Key
	Surface           marconi.Surface
	RuntimeMode       marconi.RuntimeMode
	RuntimeModeSource marconi.ModeSource
	ClientID          string
	// TokenHash is the SHA-256 of the session token; the token itself is never stored.
	TokenHash []byte
	// RegistrationKeyHash is the SHA-256 of the Idempotency-Key of the
	// registration that created the session and made its current token;
	// nil when it had none, and cleared by a resume (the resume made the
	// token) and by SpendRegistrationKey. RetryRegistration matches it.
	RegistrationKeyHash []byte
	// RegistrationAPIKeyHash is the SHA-256 of the API key of that
	// registration, kept and cleared with RegistrationKeyHash: a retry must
	// come with the same API key.
	RegistrationAPIKeyHash []byte
	RegisteredAt           time.Time
	LastSeenAt             time.Time // heartbeats and WebSocket activity; zero when never seen
	LastVerbAt             time.Time // any authenticated session call; zero when none yet
	ExpiresAt              time.Time
	// AssignedInstance is the instance a sticky session is placed on; empty for stateless.
	AssignedInstance string
	// QueueInstance is the instance holding the session's WebSocket queue; empty when none.
	QueueInstance   string
	QueueAttachedAt time.Time // when QueueInstance attached; zero when none
	// QueueDetachedAt is when the last queue detached; zero if never attached.
	// It starts the reconnect grace window.
	QueueDetachedAt time.Time
}

// FreshestProofOfLife is max(last_seen_at, last_verb_at, registered_at).
func (s Session) FreshestProofOfLife() time.Time {
	t := s.RegisteredAt
	if s.LastSeenAt.After(t) {
		t = s.LastSeenAt
	}
	if s.LastVerbAt.After(t) {
		t = s.LastVerbAt
	}
	return t
}

// Touch is a proof-of-life update. Zero times leave their column alone; the
// store never moves a time backwards.
type Touch struct {
	SeenAt    time.Time
	VerbAt    time.Time
	ExpiresAt time.Time
}

// SessionFilter selects sessions for ListSessions. Empty fields match all.
type SessionFilter struct {
	TenantID  string
	ProjectID string
	Limit     int // 0 means no limit
}

// APIKey is a project API key as stored: only its hash.
type APIKey struct {
	Hash      []byte // SHA-256 of the key
	TenantID  string
	ProjectID string
	CreatedAt time.Time
}

// Signal is one durable signal addressed to a session.
type Signal struct {
	ID          string
	Seq         int64 // per recipient, from 1, gap-free
	To          Key
	FromSession string // sender's session id (same tenant and project as To)
	Kind        string
	// Payload is the sender's JSON text exactly as given to AppendSignal,
	// byte for byte (never re-encoded), so that every replay of a signal
	// carries the bytes of its live push.
	Payload   json.RawMessage
	CreatedAt time.Time
	// IdempotencyKey is the sender's key, empty when none was given.
	IdempotencyKey string
	// Delivery and RouteState record how the send was classified, so that a
	// duplicate send can answer with the first response.
	Delivery   marconi.Delivery
	RouteState marconi.RouteState
}

// NewSignal is what AppendSignal stores. The store assigns Seq.
type NewSignal struct {
	ID             string
	To             Key
	FromSession    string
	Kind           string
	Payload        json.RawMessage
	CreatedAt      time.Time
	IdempotencyKey string
	// IdempotencySince bounds the idempotency window: an earlier signal from
	// the same sender with the same key created at or after it is a duplicate.
	IdempotencySince time.Time
	Delivery         marconi.Delivery
	RouteState       marconi.RouteState
	// Limits are the store-side quotas this append must respect; zero
	// fields are unlimited.
	Limits Limits
	// SenderTokenHash, when set, makes the store authorise the append in
	// the same step: a live session FromSession in To's tenant and project
	// must hold this token hash. A caller that authenticated the sender
	// from a cache relies on it, so a token rotated, deleted or expired
	// anywhere can never send.
	SenderTokenHash []byte
	// Seen, when set, is what the caller read of the recipient before
	// classifying its route (possibly some time ago): the append stores
	// nothing and returns ErrRecipientChanged unless the live recipient is
	// still that registration with that token and that queue.
	Seen *RecipientSeen
}

// RecipientSeen is what a send's route classification read of its
// recipient: its registration (RegisteredAt), its token and its queue. Any
// attach, detach, move, resume, takeover or registration again changes one
// of them.
type RecipientSeen struct {
	RegisteredAt    time.Time
	TokenHash       []byte
	QueueInstance   string
	QueueAttachedAt time.Time
}

// SeenOf is what s shows of itself as a recipient.
func SeenOf(s Session) *RecipientSeen {
	return &RecipientSeen{RegisteredAt: s.RegisteredAt, TokenHash: s.TokenHash, QueueInstance: s.QueueInstance, QueueAttachedAt: s.QueueAttachedAt}
}

// Limits are the quotas a store enforces atomically inside AppendSignal: a
// refused append stores nothing and returns a *QuotaError. Zero means no
// limit. Acknowledgements are cumulative, so a recipient's pending signals
// are those above its highest acknowledged seq.
type Limits struct {
	// PendingPerRecipient bounds the unacknowledged signals of one
	// recipient (MARCONI_QUOTA_PENDING_PER_RECIPIENT).
	PendingPerRecipient int64
	// PendingBytesPerProject bounds the payload bytes of the unacknowledged
	// signals of one project (MARCONI_QUOTA_PENDING_BYTES_PER_PROJECT).
	// Signals of a session that expired count until Prune removes it.
	PendingBytesPerProject int64
}

// Instance is one hub instance as seen in the shared registry.
type Instance struct {
	ID              string
	URL             string
	Draining        bool
	StartedAt       time.Time
	LastHeartbeatAt time.Time
	// BusKeyVersion is the version of the bus key the instance sealed
	// wake-ups with at its last heartbeat; 0 is unknown (not read yet, a
	// store without a bus key, or an instance of a release that does not
	// write it). HeartbeatInstance stores 0 as unknown.
	BusKeyVersion int64
}

// FallbackEvent records a sticky session taken over by another instance.
type FallbackEvent struct {
	Key
	FromInstance      string
	ToInstance        string
	RuntimeMode       marconi.RuntimeMode
	RuntimeModeSource marconi.ModeSource
	Reason            string
	At                time.Time
	// Counter is the cluster-wide counter RecordFallback adds one to:
	// CounterFallbacks when empty. It is not kept with the event
	// (ListFallbacks returns it empty).
	Counter Counter
}

// SessionStats are aggregates over the live sessions, for placement and the
// fabric summary. Every map is non-nil.
type SessionStats struct {
	Total    int
	ByMode   map[marconi.RuntimeMode]int
	BySource map[marconi.ModeSource]int
	// ByAssignedInstance counts sessions by their sticky assignment; sessions
	// with none are not counted.
	ByAssignedInstance map[string]int
	// ByQueueInstance counts sessions by the instance holding their queue;
	// sessions with no queue are not counted.
	ByQueueInstance map[string]int
}

// KeepFallbackEvents is how many of the most recent fallback events a store
// keeps; older ones are pruned (the counters still count every event).
const KeepFallbackEvents = 1000

// Counts are cluster-wide counters kept by the store (fabric summary).
type Counts struct {
	Fallbacks                   int64
	Reassignments               int64
	AdaptivePlacements          int64
	AdaptivePlacementMismatches int64
}

// Counter names one of the Counts.
type Counter string

// Counter names.
const (
	CounterFallbacks                   Counter = "fallbacks"
	CounterReassignments               Counter = "reassignments"
	CounterAdaptivePlacements          Counter = "adaptive_placements"
	CounterAdaptivePlacementMismatches Counter = "adaptive_placement_mismatches"
)

// Store is the durable registry. Implementations are safe for concurrent use.
// Every method may also return ErrUnavailable when the backing store cannot
// be reached; other failures are wrapped internal errors.
type Store interface {
	// Ping checks that the store is reachable. Returns ErrUnavailable otherwise.
	Ping(ctx context.Context) error
	// Close releases the store's resources.
	Close() error

	// CreateSession stores a new session. A session with the same key that
	// expired before now is replaced (its signals and idempotency keys go with
	// it). Returns ErrConflict when a live session with the key exists, or
	// when the token hash is already in use.
	CreateSession(ctx context.Context, s Session, now time.Time) (Session, error)
	// ResumeSession swaps the token hash of a live session from oldHash to
	// newHash and applies t. Returns ErrNotFound when no live session has the
	// key, ErrTokenMismatch when oldHash is not its current hash.
	// A resume clears RegistrationKeyHash and RegistrationAPIKeyHash: the
	// token is no longer the one that registration made.
	ResumeSession(ctx context.Context, k Key, oldHash, newHash []byte, t Touch, now time.Time) (Session, error)
	// RetryRegistration answers the retry of a registration whose answer was
	// lost: it swaps the token hash of the live session k to newHash and
	// applies t, when the session's RegistrationKeyHash is keyHash and its
	// RegistrationAPIKeyHash is apiKeyHash (neither empty) and it was
	// registered at or after since. Returns ErrNotFound otherwise (no live
	// session, no key or another, another API key, registered before since,
	// resumed or its token used since): one lookup either way, since a
	// registration tries it before creating. ErrConflict when newHash is
	// another session's.
	RetryRegistration(ctx context.Context, k Key, keyHash, apiKeyHash []byte, since time.Time, newHash []byte, t Touch, now time.Time) (Session, error)
	// SpendRegistrationKey clears RegistrationKeyHash and
	// RegistrationAPIKeyHash of session k while its token hash is
	// tokenHash: the first authenticated use of the token a registration
	// made spends that registration's Idempotency-Key. Nothing changes, and
	// no error, when the session holds another token or no key.
	SpendRegistrationKey(ctx context.Context, k Key, tokenHash []byte) error
	// SessionByToken returns the live session whose token hash is h.
	// Returns ErrNotFound when none.
	SessionByToken(ctx context.Context, h []byte, now time.Time) (Session, error)
	// GetSession returns the live session with key k. Returns ErrNotFound when none.
	GetSession(ctx context.Context, k Key, now time.Time) (Session, error)
	// SessionHeads returns the heads of the sessions among keys live at now,
	// by key, in one read (the pending sweep's, for a batch of connections).
	// A key with no live session is absent from the map, not an error.
	SessionHeads(ctx context.Context, keys []Key, now time.Time) (map[Key]SessionHead, error)
	// ListSessions returns live sessions matching f, ordered by tenant,
	// project and session id.
	ListSessions(ctx context.Context, f SessionFilter, now time.Time) ([]Session, error)
	// CountSessions counts the live sessions matching f, counting no
	// further than f.Limit when it is positive (a quota check needs only
	// to know whether the limit is reached).
	CountSessions(ctx context.Context, f SessionFilter, now time.Time) (int, error)
	// TouchSession records proof of life. It never moves a time earlier:
	// an expiry written or read is a lower bound of the session's from then
	// on (the connection hub's expiry check relies on it). Returns
	// ErrNotFound when no live session has the key.
	TouchSession(ctx context.Context, k Key, t Touch, now time.Time) error
	// TouchSessionAs records proof of life as TouchSession does, but only
	// while h still speaks for k, checked in the same write: k is live at
	// now, is the registration h.RegisteredAt and holds h.TokenHash (a row
	// without a token hash proves nothing against h). A call authenticated
	// before a registration again or a resume so never extends the session
	// that replaced its own. Returns ErrNotFound otherwise (gone, registered
	// again, or holding another token); nothing changes then.
	TouchSessionAs(ctx context.Context, k Key, h Holder, t Touch, now time.Time) error
	// DeleteSession removes a session with its signals. Returns ErrNotFound
	// when no session has the key.
	DeleteSession(ctx context.Context, k Key) error

	// SetQueue records that instance holds the session's queue since at: a
	// compare-and-set on the attachment. It changes nothing when the stored
	// attachment is newer than at (a later attach, here or elsewhere, won) or
	// when the queue was detached after at (this attach already ended), so a
	// late write from an older attach never leaves the store naming the
	// wrong instance. Returns ErrNotFound when no session has the key.
	SetQueue(ctx context.Context, k Key, instance string, at time.Time) error
	// AttachQueue records an attach in one step: SetQueue's compare-and-set
	// of instance's queue since at, and the attach's proof of life t, as
	// TouchSession records it. It returns how many signals of k are
	// unacknowledged then (as CountPending), for the attach's welcome.
	// Returns ErrNotFound when no live session has the key at now; nothing
	// changes then.
	AttachQueue(ctx context.Context, k Key, instance string, at time.Time, t Touch, now time.Time) (pending int, err error)
	// ClearQueue records that the queue detached at at, but only while the
	// attachment is still the one instance recorded at attachedAt (the at of
	// its SetQueue): a newer attach, elsewhere or on the same instance, wins.
	// It reports whether it cleared anything.
	ClearQueue(ctx context.Context, k Key, instance string, attachedAt, at time.Time) (bool, error)
	// AssignInstance sets the sticky assignment of a session, whatever it
	// was: a takeover, which must not overwrite a racing one, uses
	// ReassignInstance. Returns ErrNotFound when no session has the key.
	AssignInstance(ctx context.Context, k Key, instance string) error
	// ReassignInstance moves the sticky assignment of a session from from to
	// to, atomically, but only while it is still from: of several instances
	// that read the same assignment and race to take the session over,
	// exactly one moves it. It reports whether this call moved it (false when
	// the assignment is no longer from; nothing changed). Returns ErrNotFound
	// when no session has the key.
	ReassignInstance(ctx context.Context, k Key, from, to string) (bool, error)

	// PutAPIKey stores an API key hash. Returns ErrConflict when the hash exists.
	PutAPIKey(ctx context.Context, k APIKey) error
	// APIKeyByHash returns the API key with hash h. Returns ErrNotFound when none.
	APIKeyByHash(ctx context.Context, h []byte) (APIKey, error)
	// DeleteAPIKey removes the API key with hash h and returns it as it was
	// stored; from then on it authenticates nothing. Returns ErrNotFound
	// when none.
	DeleteAPIKey(ctx context.Context, h []byte) (APIKey, error)

	// AppendSignal stores a signal for a live recipient with the next seq of
	// that recipient, atomically. When the sender already sent a signal with
	// the same non-empty idempotency key since IdempotencySince, nothing is
	// stored and that signal is returned with duplicate true (a duplicate is
	// never refused by a quota). Returns ErrNotFound when the recipient is
	// not a live session, ErrTokenMismatch when s.SenderTokenHash is set and
	// no live session FromSession holds it (checked before anything else), a
	// *QuotaError (ErrQuotaExceeded) when s.Limits refuse it, and
	// ErrInvalidInput when a value cannot be stored. Nothing is stored on
	// any error. With s.Seen set, it returns ErrRecipientChanged when the
	// live recipient is no longer what Seen says (checked after the
	// duplicate lookup and before the quotas).
	AppendSignal(ctx context.Context, s NewSignal, now time.Time) (sig Signal, duplicate bool, err error)
	// PendingSignals returns the unacknowledged signals of k with seq >
	// afterSeq, in seq order, at most limit of them.
	PendingSignals(ctx context.Context, k Key, afterSeq int64, limit int) ([]Signal, error)
	// AckSignals acknowledges every signal of k with seq <= upToSeq and
	// returns how many this call acknowledged. An acknowledged signal is
	// never delivered again and its bytes no longer count against the
	// pending quotas; it stays until Prune (id, seq, sender, idempotency key,
	// the send's answer: what ordering and a duplicate send need; a store
	// may keep its payload too, or drop it at once), and a duplicate of it
	// is answered with a Signal whose Payload is nil.
	AckSignals(ctx context.Context, k Key, upToSeq int64, at time.Time) (int, error)
	// AckSignalsAs acknowledges as AckSignals does, in the same write as it
	// checks that h still speaks for k: k is live at at, is the
	// registration h.RegisteredAt, and holds h.TokenHash (a row without a
	// token hash proves nothing against h). Returns ErrNotFound when k is
	// not live or was registered again since, ErrTokenMismatch when it holds
	// another token, and an error wrapping ErrConflict when k changed while
	// the check ran (the caller reads it again to learn how). Nothing is
	// acknowledged on any error.
	AckSignalsAs(ctx context.Context, k Key, h Holder, upToSeq int64, at time.Time) (int, error)
	// CountPending returns how many signals of k are unacknowledged.
	CountPending(ctx context.Context, k Key) (int, error)
	// PendingTotal returns how many signals of sessions live at now are
	// unacknowledged, across every tenant (the pending-signals gauge).
	PendingTotal(ctx context.Context, now time.Time) (int, error)
	// DropPending acknowledges every pending signal of k without delivery
	// (disconnect policy drop) and returns how many.
	DropPending(ctx context.Context, k Key, at time.Time) (int, error)
	// Prune deletes the acknowledged signals made before ackedMadeBefore
	// (when they were acknowledged does not matter), sessions (with
	// all their signals) that expired before expiredBefore, instances whose
	// last heartbeat is before expiredBefore (an instance id may be new per
	// process, such as a pod's host name, so the registry would otherwise
	// grow without bound; a pruned instance that heartbeats again is simply
	// registered again), and fallback events beyond the newest
	// KeepFallbackEvents. It returns
	// how many signals and sessions it removed. An acknowledged signal keeps
	// its idempotency key until pruned, and the idempotency window counts
	// from when a signal was made, so callers keep acknowledged signals at
	// least as long as that window. A store may delete in
	// batches, each committed on its own, so that a backlog of any size
	// shrinks under a per-call timeout: on an error (ctx ending included) the
	// counts are what it removed before the error, and a later Prune goes on.
	Prune(ctx context.Context, ackedMadeBefore, expiredBefore time.Time) (signals, sessions int, err error)

	// HeartbeatInstance inserts or updates an instance row.
	HeartbeatInstance(ctx context.Context, in Instance) error
	// SessionStats aggregates the sessions live at now.
	SessionStats(ctx context.Context, now time.Time) (SessionStats, error)
	// CountByClient counts the sessions live at now whose
	// runtime_mode_source is source, by client_id and then by runtime_mode
	// (the canary view of adaptive placements). The map is non-nil.
	CountByClient(ctx context.Context, now time.Time, source marconi.ModeSource) (map[string]map[marconi.RuntimeMode]int, error)
	// ListInstances returns every known instance, ordered by id.
	ListInstances(ctx context.Context) ([]Instance, error)
	// RecordFallback stores a fallback event and counts it in e.Counter
	// (CounterFallbacks when empty), atomically.
	RecordFallback(ctx context.Context, e FallbackEvent) error
	// ListFallbacks returns the newest fallback events first, at most limit.
	ListFallbacks(ctx context.Context, limit int) ([]FallbackEvent, error)
	// AddCount adds n to a cluster-wide counter.
	AddCount(ctx context.Context, c Counter, n int64) error
	// Counts returns the cluster-wide counters.
	Counts(ctx context.Context) (Counts, error)
}
