package storetest

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// t0 is the suite's reference instant. It carries sub-microsecond digits on
// purpose: every time fed to a store goes through at() first, which truncates
// to the microsecond, as Postgres would.
var t0 = time.Date(2031, 3, 4, 5, 6, 7, 123456789, time.UTC).Truncate(time.Microsecond)

// at returns t0+d truncated to the microsecond.
func at(d time.Duration) time.Time { return t0.Add(d).Truncate(time.Microsecond) }

// hash returns a deterministic 32-byte token hash for a label.
func hash(label string) []byte {
	h := sha256.Sum256([]byte(label))
	return h[:]
}

// key builds a session key.
func key(tenant, project, session string) sessionstore.Key {
	return sessionstore.Key{TenantID: tenant, ProjectID: project, SessionID: session}
}

// Run runs the conformance suite of sessionstore.Store. newStore is called once
// per subtest and must return a new, empty store of its own (its own schema or
// database for a durable store), and arrange its own cleanup with t.Cleanup.
// Subtests run in parallel. The suite itself calls Close only in the subtest
// that checks a closed store, so a store's Close must tolerate being called
// again by that cleanup.
func Run(t *testing.T, newStore func(t *testing.T) sessionstore.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s sessionstore.Store)
	}{
		{"Ping", testPing},
		{"Close/later calls return ErrUnavailable", testClose},
		{"CreateSession/round-trips every field at microsecond precision", testCreateRoundTrip},
		{"CreateSession/zero times stay zero", testCreateZeroTimes},
		{"CreateSession/conflict on a live key", testCreateConflictKey},
		{"CreateSession/conflict on a token hash in use", testCreateConflictHash},
		{"CreateSession/replaces an expired session with its signals and idempotency keys", testCreateOverExpired},
		{"ResumeSession/swaps the token and applies the touch", testResumeSwap},
		{"ResumeSession/wrong old hash is ErrTokenMismatch and changes nothing", testResumeMismatch},
		{"ResumeSession/unknown or expired is ErrNotFound", testResumeNotFound},
		{"ResumeSession/forgets the registration key", testResumeForgetsRegistrationKey},
		{"RetryRegistration/same key swaps the token, again and again", testRetryRegistrationSwap},
		{"RetryRegistration/another, no or too old a key, or another API key, is ErrNotFound and changes nothing", testRetryRegistrationMismatch},
		{"RetryRegistration/unknown, expired or another tenant's is ErrNotFound", testRetryRegistrationNotFound},
		{"SpendRegistrationKey/clears the key of the token's session only", testSpendRegistrationKey},
		{"Expired sessions are invisible to reads and touches", testExpiredInvisible},
		{"TouchSession/never moves a time backwards and extends expiry", testTouch},
		{"TouchSessionAs/touches only for the registration and token that still hold the session", testTouchAs},
		{"ListSessions and CountSessions/filter, order and limit", testListSessions},
		{"SessionHeads/live sessions only, with their last and acked seqs", testSessionHeads},
		{"SessionHeads/many keys in one read", testSessionHeadsMany},
		{"DeleteSession/removes the session and its signals", testDelete},
		{"DeleteSession/removes an expired row too (ErrNotFound only when no row)", testDeleteExpired},
		{"Tenant isolation/same session id in two tenants or projects", testTenantIsolation},
		{"SetQueue and ClearQueue/a newer attach elsewhere wins", testQueue},
		{"SetQueue and ClearQueue/compare-and-set: a late write of an older attach changes nothing", testQueueCompareAndSet},
		{"AttachQueue/compare-and-set and touch in one step; a session not live is ErrNotFound and changes nothing", testAttachQueue},
		{"SetQueue, AttachQueue and TouchSession/many at once each get their own answer", testRowWritesConcurrent},
		{"ClearQueue/many at once: each clears only its own attach, once", testClearQueueConcurrent},
		{"AssignInstance", testAssignInstance},
		{"ReassignInstance/moves only from the assignment it names", testReassignInstance},
		{"ReassignInstance/of racing takeovers exactly one wins", testReassignConcurrent},
		{"APIKeys/put, get, conflict, not found, delete", testAPIKeys},
		{"Store keeps its own copies of byte slices and payloads", testNoAliasing},
		{"AppendSignal/seq from 1, gap-free, per recipient, fields round-trip", testAppendSeq},
		{"AppendSignal/unknown or expired recipient is ErrNotFound", testAppendNotFound},
		{"AppendSignal/idempotency window per sender and key", testAppendIdempotency},
		{"AppendSignal/payload JSON round-trips by meaning", testAppendPayload},
		{"AppendSignal/payload bytes round-trip exactly", testAppendPayloadBytes},
		{"AppendSignal/concurrent appends to one recipient get 1..N exactly once", testAppendConcurrent},
		{"AppendSignal/batch: each recipient's seq gap-free, each sender's order kept", testBatchOrderPerSender},
		{"AppendSignal/batch: one idempotency key sent at once is stored once", testBatchIdempotency},
		{"AppendSignal/batch: a failing member fails alone", testBatchFailingMember},
		{"AppendSignal/a sender token hash authorises the append in the store", testAppendSenderToken},
		{"AppendSignal and CreateSession/a value the store cannot keep is ErrInvalidInput", testInvalidInput},
		{"Quota/pending signals per recipient: refused stores nothing, acking frees room", testQuotaPendingPerRecipient},
		{"Quota/pending bytes per project: refused stores nothing, acking or deleting frees room", testQuotaPendingBytesPerProject},
		{"PendingSignals/after seq, limit, order, acked excluded", testPending},
		{"AckSignals/returns how many this call acknowledged", testAck},
		{"AckSignals/each counts what it acknowledges, none when it does not move, also after a registration again", testAckCountsItsRange},
		{"AckSignals/drops acknowledged payloads; a duplicate still gets the first answer", testAckDropsPayload},
		{"AckSignalsAs/acknowledges only for the registration and token that still hold the session", testAckAs},
		{"AppendSignal/with Seen stores only while the recipient is what the sender saw", testAppendSeen},
		{"CountPending and DropPending", testDropPending},
		{"PendingTotal counts live sessions' unacked signals", testPendingTotal},
		{"CountPending and PendingTotal agree with PendingSignals through every path", testPendingCountsAgree},
		{"Prune keeps the newest KeepFallbackEvents fallback events", testPruneFallbacks},
		{"Prune/acked signals made before the cutoff, unacked kept, idempotency kept until pruned", testPruneSignals},
		{"Prune/seq continues after every signal was pruned", testPruneSeqContinues},
		{"Prune/expired sessions go with their signals", testPruneSessions},
		{"Prune/a backlog of many batches goes whole, counted", testPruneBacklog},
		{"Instances/heartbeat upserts, list orders by id", testInstances},
		{"Prune/instances silent since before the cutoff", testPruneInstances},
		{"Fallbacks/newest first, limited, counted", testFallbacks},
		{"Fallbacks/counted in the event's counter", testFallbackCounter},
		{"SessionStats/aggregates live sessions only", testSessionStats},
		{"Counts/AddCount adds to each counter", testCounts},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t))
		})
	}
}

// --- helpers ---

// newSession returns a session live until expires, registered at t0.
func newSession(k sessionstore.Key, tokenHash []byte, expires time.Time) sessionstore.Session {
	return sessionstore.Session{
		Key:               k,
		Surface:           "cli",
		RuntimeMode:       "stateless",
		RuntimeModeSource: "default",
		ClientID:          "client-" + k.SessionID,
		TokenHash:         tokenHash,
		RegisteredAt:      t0,
		ExpiresAt:         expires,
	}
}

// mustCreate creates a session live for a day from t0, with hash(label of key).
func mustCreate(t *testing.T, s sessionstore.Store, k sessionstore.Key) sessionstore.Session {
	t.Helper()
	return mustCreateSession(t, s, newSession(k, hash(fmt.Sprint(k)), at(24*time.Hour)))
}

func mustCreateSession(t *testing.T, s sessionstore.Store, sess sessionstore.Session) sessionstore.Session {
	t.Helper()
	got, err := s.CreateSession(t.Context(), sess, t0)
	if err != nil {
		t.Fatalf("CreateSession(%v): %v", sess.Key, err)
	}
	return got
}

// send is a signal from sender to to, created at t0 with a fresh id.
func send(to sessionstore.Key, from string) sessionstore.NewSignal {
	return sessionstore.NewSignal{
		ID:               uuid.NewString(),
		To:               to,
		FromSession:      from,
		Kind:             "message",
		Payload:          json.RawMessage(`{"n":1}`),
		CreatedAt:        t0,
		IdempotencySince: at(-10 * time.Minute),
		Delivery:         "queued",
		RouteState:       "attached",
	}
}

func mustAppend(t *testing.T, s sessionstore.Store, ns sessionstore.NewSignal) sessionstore.Signal {
	t.Helper()
	sig, dup, err := s.AppendSignal(t.Context(), ns, t0)
	if err != nil {
		t.Fatalf("AppendSignal to %v: %v", ns.To, err)
	}
	if dup {
		t.Fatalf("AppendSignal to %v (key %q): duplicate = true, want false", ns.To, ns.IdempotencyKey)
	}
	return sig
}

// appendN appends n signals to k and returns them.
func appendN(t *testing.T, s sessionstore.Store, k sessionstore.Key, n int) []sessionstore.Signal {
	t.Helper()
	out := make([]sessionstore.Signal, 0, n)
	for range n {
		out = append(out, mustAppend(t, s, send(k, "sender")))
	}
	return out
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

func noErr(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func wantInt[N int | int64](t *testing.T, what string, got, want N) {
	t.Helper()
	if got != want {
		t.Fatalf("%s = %d, want %d", what, got, want)
	}
}

func wantTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// wantSession compares every field of two sessions.
func wantSession(t *testing.T, what string, got, want sessionstore.Session) {
	t.Helper()
	var diffs []string
	str := func(name, g, w string) {
		if g != w {
			diffs = append(diffs, fmt.Sprintf("%s = %q, want %q", name, g, w))
		}
	}
	tm := func(name string, g, w time.Time) {
		if !g.Equal(w) {
			diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", name, g, w))
		}
	}
	if got.Key != want.Key {
		diffs = append(diffs, fmt.Sprintf("Key = %+v, want %+v", got.Key, want.Key))
	}
	str("Surface", string(got.Surface), string(want.Surface))
	str("RuntimeMode", string(got.RuntimeMode), string(want.RuntimeMode))
	str("RuntimeModeSource", string(got.RuntimeModeSource), string(want.RuntimeModeSource))
	str("ClientID", got.ClientID, want.ClientID)
	if !bytes.Equal(got.TokenHash, want.TokenHash) {
		diffs = append(diffs, fmt.Sprintf("TokenHash = %x, want %x", got.TokenHash, want.TokenHash))
	}
	if !bytes.Equal(got.RegistrationKeyHash, want.RegistrationKeyHash) {
		diffs = append(diffs, fmt.Sprintf("RegistrationKeyHash = %x, want %x", got.RegistrationKeyHash, want.RegistrationKeyHash))
	}
	if !bytes.Equal(got.RegistrationAPIKeyHash, want.RegistrationAPIKeyHash) {
		diffs = append(diffs, fmt.Sprintf("RegistrationAPIKeyHash = %x, want %x", got.RegistrationAPIKeyHash, want.RegistrationAPIKeyHash))
	}
	tm("RegisteredAt", got.RegisteredAt, want.RegisteredAt)
	tm("LastSeenAt", got.LastSeenAt, want.LastSeenAt)
	tm("LastVerbAt", got.LastVerbAt, want.LastVerbAt)
	tm("ExpiresAt", got.ExpiresAt, want.ExpiresAt)
	str("AssignedInstance", got.AssignedInstance, want.AssignedInstance)
	str("QueueInstance", got.QueueInstance, want.QueueInstance)
	tm("QueueAttachedAt", got.QueueAttachedAt, want.QueueAttachedAt)
	tm("QueueDetachedAt", got.QueueDetachedAt, want.QueueDetachedAt)
	if len(diffs) > 0 {
		t.Fatalf("%s: session differs:\n  %s", what, joinLines(diffs))
	}
}

// wantSignal compares every field of two signals; payloads by JSON meaning.
func wantSignal(t *testing.T, what string, got, want sessionstore.Signal) {
	t.Helper()
	var diffs []string
	str := func(name, g, w string) {
		if g != w {
			diffs = append(diffs, fmt.Sprintf("%s = %q, want %q", name, g, w))
		}
	}
	str("ID", got.ID, want.ID)
	if got.Seq != want.Seq {
		diffs = append(diffs, fmt.Sprintf("Seq = %d, want %d", got.Seq, want.Seq))
	}
	if got.To != want.To {
		diffs = append(diffs, fmt.Sprintf("To = %+v, want %+v", got.To, want.To))
	}
	str("FromSession", got.FromSession, want.FromSession)
	str("Kind", got.Kind, want.Kind)
	if !sameJSON(got.Payload, want.Payload) {
		diffs = append(diffs, fmt.Sprintf("Payload = %s, want %s", got.Payload, want.Payload))
	}
	if !got.CreatedAt.Equal(want.CreatedAt) {
		diffs = append(diffs, fmt.Sprintf("CreatedAt = %v, want %v", got.CreatedAt, want.CreatedAt))
	}
	str("IdempotencyKey", got.IdempotencyKey, want.IdempotencyKey)
	str("Delivery", string(got.Delivery), string(want.Delivery))
	str("RouteState", string(got.RouteState), string(want.RouteState))
	if len(diffs) > 0 {
		t.Fatalf("%s: signal differs:\n  %s", what, joinLines(diffs))
	}
}

// expected is the Signal that AppendSignal should store for ns with seq.
func expected(ns sessionstore.NewSignal, seq int64) sessionstore.Signal {
	return sessionstore.Signal{
		ID: ns.ID, Seq: seq, To: ns.To, FromSession: ns.FromSession, Kind: ns.Kind,
		Payload: ns.Payload, CreatedAt: ns.CreatedAt, IdempotencyKey: ns.IdempotencyKey,
		Delivery: ns.Delivery, RouteState: ns.RouteState,
	}
}

func sameJSON(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

func joinLines(lines []string) string {
	var b bytes.Buffer
	for i, l := range lines {
		if i > 0 {
			b.WriteString("\n  ")
		}
		b.WriteString(l)
	}
	return b.String()
}

// seqs returns the seqs of signals, in the order given.
func seqs(sigs []sessionstore.Signal) []int64 {
	out := make([]int64, 0, len(sigs))
	for _, s := range sigs {
		out = append(out, s.Seq)
	}
	return out
}

// wantPending checks that the pending signals of k (after 0, no practical
// limit) have exactly the given seqs, in order.
func wantPending(t *testing.T, s sessionstore.Store, k sessionstore.Key, want ...int64) {
	t.Helper()
	got, err := s.PendingSignals(t.Context(), k, 0, 10000)
	noErr(t, "PendingSignals", err)
	wantSeqs(t, fmt.Sprintf("pending seqs of %v", k), seqs(got), want)
}

func wantSeqs(t *testing.T, what string, got, want []int64) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func wantCount(t *testing.T, s sessionstore.Store, k sessionstore.Key, want int) {
	t.Helper()
	n, err := s.CountPending(t.Context(), k)
	noErr(t, "CountPending", err)
	wantInt(t, fmt.Sprintf("CountPending(%v)", k), n, want)
}

// --- subtests ---

func testPing(t *testing.T, s sessionstore.Store) {
	noErr(t, "Ping", s.Ping(t.Context()))
}

func testClose(t *testing.T, s sessionstore.Store) {
	noErr(t, "Close", s.Close())
	wantErr(t, "Ping after Close", s.Ping(t.Context()), sessionstore.ErrUnavailable)
	_, err := s.GetSession(t.Context(), key("t", "p", "s"), t0)
	wantErr(t, "GetSession after Close", err, sessionstore.ErrUnavailable)
	_, _, err = s.AppendSignal(t.Context(), send(key("t", "p", "s"), "x"), t0)
	wantErr(t, "AppendSignal after Close", err, sessionstore.ErrUnavailable)
	_, err = s.ReassignInstance(t.Context(), key("t", "p", "s"), "a", "b")
	wantErr(t, "ReassignInstance after Close", err, sessionstore.ErrUnavailable)
}

func testCreateRoundTrip(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	// Fed times are truncated to the microsecond: a store must keep them exactly.
	want := sessionstore.Session{
		Key:               key("tenant-a", "proj-a", "alice"),
		Surface:           "ide",
		RuntimeMode:       "sticky",
		RuntimeModeSource: "adaptive-classifier",
		ClientID:          "client-42",
		TokenHash:         hash("alice"),
		RegisteredAt:      t0,
		LastSeenAt:        at(1500 * time.Microsecond),
		LastVerbAt:        at(2*time.Second + 7*time.Microsecond),
		ExpiresAt:         at(time.Hour + 3*time.Microsecond),
		AssignedInstance:  "hub-1",
		QueueInstance:     "hub-2",
		QueueAttachedAt:   at(time.Second),
		QueueDetachedAt:   at(500 * time.Millisecond),
	}
	got, err := s.CreateSession(ctx, want, t0)
	noErr(t, "CreateSession", err)
	wantSession(t, "CreateSession result", got, want)

	got, err = s.GetSession(ctx, want.Key, at(time.Minute))
	noErr(t, "GetSession", err)
	wantSession(t, "GetSession", got, want)

	got, err = s.SessionByToken(ctx, hash("alice"), at(time.Minute))
	noErr(t, "SessionByToken", err)
	wantSession(t, "SessionByToken", got, want)
}

func testCreateZeroTimes(t *testing.T, s sessionstore.Store) {
	want := newSession(key("t", "p", "bob"), hash("bob"), at(time.Hour))
	mustCreateSession(t, s, want)
	got, err := s.GetSession(t.Context(), want.Key, t0)
	noErr(t, "GetSession", err)
	wantSession(t, "GetSession", got, want)
	for name, tm := range map[string]time.Time{
		"LastSeenAt": got.LastSeenAt, "LastVerbAt": got.LastVerbAt,
		"QueueAttachedAt": got.QueueAttachedAt, "QueueDetachedAt": got.QueueDetachedAt,
	} {
		if !tm.IsZero() {
			t.Errorf("%s = %v, want the zero time", name, tm)
		}
	}
}

func testCreateConflictKey(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	first := mustCreateSession(t, s, newSession(k, hash("first"), at(time.Hour)))

	second := newSession(k, hash("second"), at(2*time.Hour))
	second.ClientID = "other"
	_, err := s.CreateSession(ctx, second, at(time.Minute))
	wantErr(t, "CreateSession over a live key", err, sessionstore.ErrConflict)

	got, err := s.GetSession(ctx, k, at(time.Minute))
	noErr(t, "GetSession", err)
	wantSession(t, "session after the conflict", got, first)
	_, err = s.SessionByToken(ctx, hash("second"), at(time.Minute))
	wantErr(t, "SessionByToken(second hash)", err, sessionstore.ErrNotFound)
}

func testCreateConflictHash(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	mustCreateSession(t, s, newSession(key("t", "p", "alice"), hash("shared"), at(time.Hour)))
	_, err := s.CreateSession(ctx, newSession(key("t", "p", "bob"), hash("shared"), at(time.Hour)), t0)
	wantErr(t, "CreateSession with a hash in use", err, sessionstore.ErrConflict)
	_, err = s.GetSession(ctx, key("t", "p", "bob"), t0)
	wantErr(t, "GetSession(bob)", err, sessionstore.ErrNotFound)
	got, err := s.SessionByToken(ctx, hash("shared"), t0)
	noErr(t, "SessionByToken", err)
	if got.SessionID != "alice" {
		t.Fatalf("SessionByToken(shared) = %q, want alice", got.SessionID)
	}
}

func testCreateOverExpired(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreate(t, s, key("t", "p", "sender"))
	mustCreateSession(t, s, newSession(k, hash("old"), at(time.Minute)))
	appendN(t, s, k, 2)
	ns := send(k, "sender")
	ns.IdempotencyKey = "idem-1"
	mustAppend(t, s, ns)
	wantPending(t, s, k, 1, 2, 3)

	// At t0+2m the old session has expired: a new one with the same key replaces it.
	now := at(2 * time.Minute)
	repl := newSession(k, hash("new"), at(time.Hour))
	repl.RegisteredAt = now
	repl.ClientID = "reborn"
	got, err := s.CreateSession(ctx, repl, now)
	noErr(t, "CreateSession over an expired session", err)
	wantSession(t, "CreateSession result", got, repl)

	wantPending(t, s, k)
	wantCount(t, s, k, 0)
	_, err = s.SessionByToken(ctx, hash("old"), now)
	wantErr(t, "SessionByToken(old hash)", err, sessionstore.ErrNotFound)

	// The idempotency key of the old session's signal went with it.
	again := send(k, "sender")
	again.IdempotencyKey = "idem-1"
	again.CreatedAt = now
	again.IdempotencySince = at(-time.Hour)
	sig, dup, err := s.AppendSignal(ctx, again, now)
	noErr(t, "AppendSignal after replace", err)
	if dup {
		t.Fatal("AppendSignal after replace: duplicate = true; the old session's idempotency keys should be gone")
	}
	wantInt(t, "seq of the first signal after replace", sig.Seq, 1)
}

func testResumeSwap(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	orig := mustCreateSession(t, s, newSession(k, hash("h1"), at(time.Hour)))

	now := at(time.Minute)
	touch := sessionstore.Touch{SeenAt: now, VerbAt: at(time.Minute + time.Second), ExpiresAt: at(2 * time.Hour)}
	got, err := s.ResumeSession(ctx, k, hash("h1"), hash("h2"), touch, now)
	noErr(t, "ResumeSession", err)
	want := orig
	want.TokenHash = hash("h2")
	want.LastSeenAt = touch.SeenAt
	want.LastVerbAt = touch.VerbAt
	want.ExpiresAt = touch.ExpiresAt
	wantSession(t, "ResumeSession result", got, want)

	_, err = s.SessionByToken(ctx, hash("h1"), now)
	wantErr(t, "SessionByToken(old hash)", err, sessionstore.ErrNotFound)
	got, err = s.SessionByToken(ctx, hash("h2"), now)
	noErr(t, "SessionByToken(new hash)", err)
	wantSession(t, "SessionByToken(new hash)", got, want)

	// The old hash no longer resumes.
	_, err = s.ResumeSession(ctx, k, hash("h1"), hash("h3"), sessionstore.Touch{}, now)
	wantErr(t, "ResumeSession with the swapped-out hash", err, sessionstore.ErrTokenMismatch)
}

func testResumeMismatch(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	orig := mustCreateSession(t, s, newSession(k, hash("h1"), at(time.Hour)))
	now := at(time.Minute)
	_, err := s.ResumeSession(ctx, k, hash("wrong"), hash("h2"),
		sessionstore.Touch{SeenAt: now, ExpiresAt: at(3 * time.Hour)}, now)
	wantErr(t, "ResumeSession with a wrong old hash", err, sessionstore.ErrTokenMismatch)

	got, err := s.SessionByToken(ctx, hash("h1"), now)
	noErr(t, "SessionByToken(h1)", err)
	wantSession(t, "session after the mismatch", got, orig)
	_, err = s.SessionByToken(ctx, hash("h2"), now)
	wantErr(t, "SessionByToken(h2)", err, sessionstore.ErrNotFound)
}

func testResumeNotFound(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	_, err := s.ResumeSession(ctx, key("t", "p", "nobody"), hash("a"), hash("b"), sessionstore.Touch{}, t0)
	wantErr(t, "ResumeSession(unknown)", err, sessionstore.ErrNotFound)

	k := key("t", "p", "alice")
	mustCreateSession(t, s, newSession(k, hash("h1"), at(time.Minute)))
	_, err = s.ResumeSession(ctx, k, hash("h1"), hash("h2"), sessionstore.Touch{ExpiresAt: at(time.Hour)}, at(2*time.Minute))
	wantErr(t, "ResumeSession(expired)", err, sessionstore.ErrNotFound)
	// Wrong key in another tenant with the right hash is not found either.
	_, err = s.ResumeSession(ctx, key("other", "p", "alice"), hash("h1"), hash("h2"), sessionstore.Touch{}, t0)
	wantErr(t, "ResumeSession(other tenant)", err, sessionstore.ErrNotFound)
}

// newKeyedSession is newSession registered with the Idempotency-Key hash
// hash(regKey), by the API key hashed hash("api").
func newKeyedSession(k sessionstore.Key, tokenHash []byte, regKey string, expires time.Time) sessionstore.Session {
	sess := newSession(k, tokenHash, expires)
	sess.RegistrationKeyHash = hash(regKey)
	sess.RegistrationAPIKeyHash = hash("api")
	return sess
}

func testResumeForgetsRegistrationKey(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	orig := mustCreateSession(t, s, newKeyedSession(k, hash("h1"), "reg", at(time.Hour)))
	wantSession(t, "CreateSession result", orig, newKeyedSession(k, hash("h1"), "reg", at(time.Hour)))

	got, err := s.ResumeSession(ctx, k, hash("h1"), hash("h2"), sessionstore.Touch{}, t0)
	noErr(t, "ResumeSession", err)
	want := orig
	want.TokenHash, want.RegistrationKeyHash, want.RegistrationAPIKeyHash = hash("h2"), nil, nil
	wantSession(t, "ResumeSession result", got, want)
	// The token is the resume's now: the registration's key no longer retries.
	_, err = s.RetryRegistration(ctx, k, hash("reg"), hash("api"), t0, hash("h3"), sessionstore.Touch{}, t0)
	wantErr(t, "RetryRegistration after a resume", err, sessionstore.ErrNotFound)
}

func testRetryRegistrationSwap(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	orig := mustCreateSession(t, s, newKeyedSession(k, hash("h1"), "reg", at(time.Hour)))

	now := at(time.Minute)
	touch := sessionstore.Touch{VerbAt: now, ExpiresAt: at(2 * time.Hour)}
	got, err := s.RetryRegistration(ctx, k, hash("reg"), hash("api"), t0, hash("h2"), touch, now)
	noErr(t, "RetryRegistration", err)
	want := orig
	want.TokenHash = hash("h2")
	want.LastVerbAt, want.ExpiresAt = touch.VerbAt, touch.ExpiresAt
	wantSession(t, "RetryRegistration result", got, want)
	_, err = s.SessionByToken(ctx, hash("h1"), now)
	wantErr(t, "SessionByToken(lost hash)", err, sessionstore.ErrNotFound)
	got, err = s.SessionByToken(ctx, hash("h2"), now)
	noErr(t, "SessionByToken(new hash)", err)
	wantSession(t, "SessionByToken(new hash)", got, want)

	// A retry whose answer was lost too is retried again with the same key.
	got, err = s.RetryRegistration(ctx, k, hash("reg"), hash("api"), t0, hash("h3"), sessionstore.Touch{}, now)
	noErr(t, "second RetryRegistration", err)
	want.TokenHash = hash("h3")
	wantSession(t, "second RetryRegistration result", got, want)
	_, err = s.SessionByToken(ctx, hash("h2"), now)
	wantErr(t, "SessionByToken(second lost hash)", err, sessionstore.ErrNotFound)

	// Another session's token hash is not taken.
	mustCreateSession(t, s, newSession(key("t", "p", "bob"), hash("bob"), at(time.Hour)))
	_, err = s.RetryRegistration(ctx, k, hash("reg"), hash("api"), t0, hash("bob"), sessionstore.Touch{}, now)
	wantErr(t, "RetryRegistration to a hash in use", err, sessionstore.ErrConflict)
}

func testRetryRegistrationMismatch(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	orig := mustCreateSession(t, s, newKeyedSession(k, hash("h1"), "reg", at(time.Hour)))
	unkeyed := key("t", "p", "bob")
	mustCreateSession(t, s, newSession(unkeyed, hash("b1"), at(time.Hour)))
	now := at(time.Minute)
	touch := sessionstore.Touch{VerbAt: now, ExpiresAt: at(3 * time.Hour)}

	_, err := s.RetryRegistration(ctx, k, hash("other"), hash("api"), t0, hash("h2"), touch, now)
	wantErr(t, "RetryRegistration with another key", err, sessionstore.ErrNotFound)
	_, err = s.RetryRegistration(ctx, k, hash("reg"), hash("other api"), t0, hash("h2"), touch, now)
	wantErr(t, "RetryRegistration with another API key", err, sessionstore.ErrNotFound)
	_, err = s.RetryRegistration(ctx, k, hash("reg"), nil, t0, hash("h2"), touch, now)
	wantErr(t, "RetryRegistration with no API key", err, sessionstore.ErrNotFound)
	_, err = s.RetryRegistration(ctx, k, nil, hash("api"), t0, hash("h2"), touch, now)
	wantErr(t, "RetryRegistration with no key", err, sessionstore.ErrNotFound)
	_, err = s.RetryRegistration(ctx, k, hash("reg"), hash("api"), t0.Add(time.Second), hash("h2"), touch, now)
	wantErr(t, "RetryRegistration of a registration before since", err, sessionstore.ErrNotFound)
	_, err = s.RetryRegistration(ctx, unkeyed, nil, hash("api"), t0, hash("b2"), touch, now)
	wantErr(t, "RetryRegistration of a session registered without a key", err, sessionstore.ErrNotFound)

	got, err := s.GetSession(ctx, k, now)
	noErr(t, "GetSession", err)
	wantSession(t, "session after the mismatches", got, orig)
	for _, h := range []string{"h2", "b2"} {
		_, err = s.SessionByToken(ctx, hash(h), now)
		wantErr(t, "SessionByToken("+h+")", err, sessionstore.ErrNotFound)
	}
}

func testSpendRegistrationKey(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	orig := mustCreateSession(t, s, newKeyedSession(k, hash("h1"), "reg", at(time.Hour)))

	// Another token (a stale one) spends nothing.
	noErr(t, "SpendRegistrationKey(another token)", s.SpendRegistrationKey(ctx, k, hash("other")))
	got, err := s.GetSession(ctx, k, t0)
	noErr(t, "GetSession", err)
	wantSession(t, "session after a spend with another token", got, orig)

	noErr(t, "SpendRegistrationKey", s.SpendRegistrationKey(ctx, k, hash("h1")))
	want := orig
	want.RegistrationKeyHash, want.RegistrationAPIKeyHash = nil, nil
	got, err = s.GetSession(ctx, k, t0)
	noErr(t, "GetSession", err)
	wantSession(t, "session after its key is spent", got, want)
	_, err = s.RetryRegistration(ctx, k, hash("reg"), hash("api"), t0, hash("h2"), sessionstore.Touch{}, t0)
	wantErr(t, "RetryRegistration with a spent key", err, sessionstore.ErrNotFound)
	// Spending again, or a session with no key or none at all, is no error.
	noErr(t, "SpendRegistrationKey again", s.SpendRegistrationKey(ctx, k, hash("h1")))
	noErr(t, "SpendRegistrationKey(unknown)", s.SpendRegistrationKey(ctx, key("t", "p", "nobody"), hash("h1")))
}

func testRetryRegistrationNotFound(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	_, err := s.RetryRegistration(ctx, key("t", "p", "nobody"), hash("reg"), hash("api"), t0, hash("h2"), sessionstore.Touch{}, t0)
	wantErr(t, "RetryRegistration(unknown)", err, sessionstore.ErrNotFound)

	k := key("t", "p", "alice")
	mustCreateSession(t, s, newKeyedSession(k, hash("h1"), "reg", at(time.Minute)))
	_, err = s.RetryRegistration(ctx, k, hash("reg"), hash("api"), t0, hash("h2"), sessionstore.Touch{ExpiresAt: at(time.Hour)}, at(2*time.Minute))
	wantErr(t, "RetryRegistration(expired)", err, sessionstore.ErrNotFound)
	_, err = s.RetryRegistration(ctx, key("other", "p", "alice"), hash("reg"), hash("api"), t0, hash("h2"), sessionstore.Touch{}, t0)
	wantErr(t, "RetryRegistration(other tenant)", err, sessionstore.ErrNotFound)
}

func testExpiredInvisible(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreateSession(t, s, newSession(k, hash("h"), at(time.Minute)))

	// Before expiry every read sees it. (The exact instant of expiry is not
	// pinned: the suite stays clear of now == ExpiresAt.)
	before := at(30 * time.Second)
	_, err := s.GetSession(ctx, k, before)
	noErr(t, "GetSession before expiry", err)
	_, err = s.SessionByToken(ctx, hash("h"), before)
	noErr(t, "SessionByToken before expiry", err)
	list, err := s.ListSessions(ctx, sessionstore.SessionFilter{}, before)
	noErr(t, "ListSessions before expiry", err)
	wantInt(t, "sessions listed before expiry", len(list), 1)

	after := at(2 * time.Minute)
	_, err = s.GetSession(ctx, k, after)
	wantErr(t, "GetSession after expiry", err, sessionstore.ErrNotFound)
	_, err = s.SessionByToken(ctx, hash("h"), after)
	wantErr(t, "SessionByToken after expiry", err, sessionstore.ErrNotFound)
	list, err = s.ListSessions(ctx, sessionstore.SessionFilter{}, after)
	noErr(t, "ListSessions after expiry", err)
	wantInt(t, "sessions listed after expiry", len(list), 0)
	err = s.TouchSession(ctx, k, sessionstore.Touch{SeenAt: after, ExpiresAt: at(time.Hour)}, after)
	wantErr(t, "TouchSession after expiry", err, sessionstore.ErrNotFound)
	// The failed touch did not revive it.
	_, err = s.GetSession(ctx, k, after)
	wantErr(t, "GetSession after a refused touch", err, sessionstore.ErrNotFound)
}

func testTouch(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	sess := newSession(k, hash("h"), at(time.Hour))
	sess.LastSeenAt = at(10 * time.Second)
	sess.LastVerbAt = at(10 * time.Second)
	want := mustCreateSession(t, s, sess)

	get := func(what string, now time.Time) {
		t.Helper()
		got, err := s.GetSession(ctx, k, now)
		noErr(t, what, err)
		wantSession(t, what, got, want)
	}

	// Only SeenAt: VerbAt and ExpiresAt are left alone.
	noErr(t, "TouchSession(seen)", s.TouchSession(ctx, k, sessionstore.Touch{SeenAt: at(20 * time.Second)}, at(20*time.Second)))
	want.LastSeenAt = at(20 * time.Second)
	get("after touching seen", at(20*time.Second))

	// Only VerbAt.
	noErr(t, "TouchSession(verb)", s.TouchSession(ctx, k, sessionstore.Touch{VerbAt: at(25 * time.Second)}, at(25*time.Second)))
	want.LastVerbAt = at(25 * time.Second)
	get("after touching verb", at(25*time.Second))

	// Older times move nothing backwards, expiry included.
	old := sessionstore.Touch{SeenAt: at(5 * time.Second), VerbAt: at(5 * time.Second), ExpiresAt: at(30 * time.Minute)}
	noErr(t, "TouchSession(older)", s.TouchSession(ctx, k, old, at(30*time.Second)))
	get("after an older touch", at(30*time.Second))

	// A later expiry extends the session past its first expiry.
	noErr(t, "TouchSession(extend)", s.TouchSession(ctx, k, sessionstore.Touch{ExpiresAt: at(2 * time.Hour)}, at(time.Minute)))
	want.ExpiresAt = at(2 * time.Hour)
	get("after extending, past the first expiry", at(90*time.Minute))

	err := s.TouchSession(ctx, key("t", "p", "nobody"), sessionstore.Touch{SeenAt: t0}, t0)
	wantErr(t, "TouchSession(unknown)", err, sessionstore.ErrNotFound)
}

func testListSessions(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	// Ids are lower-case letters and digits of one length, so that byte
	// order and any Postgres collation agree.
	for _, k := range []sessionstore.Key{
		key("t2", "p1", "s2"), key("t1", "p2", "s1"), key("t1", "p1", "s3"),
		key("t1", "p1", "s1"), key("t1", "p1", "s2"),
	} {
		mustCreate(t, s, k)
	}
	mustCreateSession(t, s, newSession(key("t1", "p1", "s0"), hash("expired"), at(time.Minute)))
	now := at(2 * time.Minute)

	list := func(f sessionstore.SessionFilter) []string {
		t.Helper()
		got, err := s.ListSessions(ctx, f, now)
		noErr(t, "ListSessions", err)
		out := make([]string, 0, len(got))
		for _, g := range got {
			out = append(out, g.TenantID+"/"+g.ProjectID+"/"+g.SessionID)
		}
		return out
	}
	cases := []struct {
		f    sessionstore.SessionFilter
		want []string
	}{
		{sessionstore.SessionFilter{}, []string{"t1/p1/s1", "t1/p1/s2", "t1/p1/s3", "t1/p2/s1", "t2/p1/s2"}},
		{sessionstore.SessionFilter{TenantID: "t1"}, []string{"t1/p1/s1", "t1/p1/s2", "t1/p1/s3", "t1/p2/s1"}},
		{sessionstore.SessionFilter{TenantID: "t1", ProjectID: "p1"}, []string{"t1/p1/s1", "t1/p1/s2", "t1/p1/s3"}},
		{sessionstore.SessionFilter{ProjectID: "p1"}, []string{"t1/p1/s1", "t1/p1/s2", "t1/p1/s3", "t2/p1/s2"}},
		{sessionstore.SessionFilter{Limit: 2}, []string{"t1/p1/s1", "t1/p1/s2"}},
		{sessionstore.SessionFilter{TenantID: "t1", Limit: 4}, []string{"t1/p1/s1", "t1/p1/s2", "t1/p1/s3", "t1/p2/s1"}},
		{sessionstore.SessionFilter{TenantID: "t1", ProjectID: "p2", Limit: 10}, []string{"t1/p2/s1"}},
		{sessionstore.SessionFilter{TenantID: "t9"}, nil},
	}
	for _, c := range cases {
		got := list(c.f)
		if len(got) != len(c.want) || (len(got) > 0 && !reflect.DeepEqual(got, c.want)) {
			t.Errorf("ListSessions(%+v) = %v, want %v", c.f, got, c.want)
		}
		// CountSessions counts what ListSessions lists, expired sessions
		// left out, the limit included.
		n, err := s.CountSessions(ctx, c.f, now)
		noErr(t, "CountSessions", err)
		if n != len(c.want) {
			t.Errorf("CountSessions(%+v) = %d, want %d", c.f, n, len(c.want))
		}
	}
}

func testDelete(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreateSession(t, s, newSession(k, hash("h"), at(time.Hour)))
	appendN(t, s, k, 2)

	noErr(t, "DeleteSession", s.DeleteSession(ctx, k))
	_, err := s.GetSession(ctx, k, t0)
	wantErr(t, "GetSession after delete", err, sessionstore.ErrNotFound)
	_, err = s.SessionByToken(ctx, hash("h"), t0)
	wantErr(t, "SessionByToken after delete", err, sessionstore.ErrNotFound)
	wantPending(t, s, k)
	wantCount(t, s, k, 0)

	wantErr(t, "DeleteSession again", s.DeleteSession(ctx, k), sessionstore.ErrNotFound)
	wantErr(t, "DeleteSession(unknown)", s.DeleteSession(ctx, key("t", "p", "nobody")), sessionstore.ErrNotFound)

	// The key and the token hash are free again; seq starts over.
	mustCreateSession(t, s, newSession(k, hash("h"), at(time.Hour)))
	sigs := appendN(t, s, k, 1)
	wantInt(t, "seq after re-create", sigs[0].Seq, 1)
}

func testDeleteExpired(t *testing.T, s sessionstore.Store) {
	// DeleteSession takes no now: its ErrNotFound is "no session has the
	// key", so an expired row that is still stored is deleted.
	k := key("t", "p", "alice")
	mustCreateSession(t, s, newSession(k, hash("h"), at(time.Minute)))
	noErr(t, "DeleteSession(expired row)", s.DeleteSession(t.Context(), k))
	wantErr(t, "DeleteSession again", s.DeleteSession(t.Context(), k), sessionstore.ErrNotFound)
}

func testTenantIsolation(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	a := key("ta", "p", "alice")
	b := key("tb", "p", "alice")
	c := key("ta", "q", "alice")
	for _, k := range []sessionstore.Key{a, b, c} {
		sess := newSession(k, hash(fmt.Sprint(k)), at(time.Hour))
		sess.ClientID = k.TenantID + "-" + k.ProjectID
		mustCreateSession(t, s, sess)
	}
	for _, k := range []sessionstore.Key{a, b, c} {
		got, err := s.GetSession(ctx, k, t0)
		noErr(t, "GetSession", err)
		if got.Key != k || got.ClientID != k.TenantID+"-"+k.ProjectID {
			t.Fatalf("GetSession(%v) = %v client %q", k, got.Key, got.ClientID)
		}
		got, err = s.SessionByToken(ctx, hash(fmt.Sprint(k)), t0)
		noErr(t, "SessionByToken", err)
		if got.Key != k {
			t.Fatalf("SessionByToken(hash of %v) = %v", k, got.Key)
		}
	}

	// Signals: each recipient has its own seq, and none crosses over.
	appendN(t, s, a, 2)
	bs := appendN(t, s, b, 1)
	wantInt(t, "first seq in the other tenant", bs[0].Seq, 1)
	wantPending(t, s, a, 1, 2)
	wantPending(t, s, b, 1)
	wantPending(t, s, c)

	n, err := s.AckSignals(ctx, a, 2, t0)
	noErr(t, "AckSignals", err)
	wantInt(t, "acked in tenant a", n, 2)
	wantCount(t, s, b, 1)
	n, err = s.DropPending(ctx, c, t0)
	noErr(t, "DropPending", err)
	wantInt(t, "dropped in project q", n, 0)
	wantCount(t, s, b, 1)

	// Idempotency keys are per tenant and project: the same sender id and
	// key elsewhere is a new signal.
	for i, to := range []sessionstore.Key{a, b, c} {
		ns := send(to, "bob")
		ns.IdempotencyKey = "same-key"
		sig, dup, err := s.AppendSignal(ctx, ns, t0)
		noErr(t, "AppendSignal(same-key)", err)
		if dup || sig.ID != ns.ID {
			t.Fatalf("send %d with a key used in another tenant or project: duplicate = %v, id %s want %s",
				i, dup, sig.ID, ns.ID)
		}
	}
	wantCount(t, s, b, 2)

	// Writes to one never touch the other.
	noErr(t, "SetQueue", s.SetQueue(ctx, b, "hub-b", t0))
	noErr(t, "AssignInstance", s.AssignInstance(ctx, b, "hub-b"))
	noErr(t, "TouchSession", s.TouchSession(ctx, b, sessionstore.Touch{SeenAt: at(time.Second)}, t0))
	got, err := s.GetSession(ctx, a, t0)
	noErr(t, "GetSession(a)", err)
	if got.QueueInstance != "" || got.AssignedInstance != "" || !got.LastSeenAt.IsZero() {
		t.Fatalf("writes to %v leaked into %v: %+v", b, a, got)
	}

	noErr(t, "DeleteSession(b)", s.DeleteSession(ctx, b))
	for _, k := range []sessionstore.Key{a, c} {
		_, err := s.GetSession(ctx, k, t0)
		noErr(t, fmt.Sprintf("GetSession(%v) after deleting %v", k, b), err)
	}
	list, err := s.ListSessions(ctx, sessionstore.SessionFilter{TenantID: "ta", ProjectID: "p"}, t0)
	noErr(t, "ListSessions", err)
	if len(list) != 1 || list[0].Key != a {
		t.Fatalf("ListSessions(ta/p) = %v, want only %v", list, a)
	}
}

// queueFixture creates alice and returns her key, her row as the test
// expects it to be stored, and a check of the stored row against it.
func queueFixture(t *testing.T, s sessionstore.Store) (sessionstore.Key, *sessionstore.Session, func(what string)) {
	k := key("t", "p", "alice")
	want := mustCreate(t, s, k)
	check := func(what string) {
		t.Helper()
		got, err := s.GetSession(t.Context(), k, t0)
		noErr(t, what, err)
		wantSession(t, what, got, want)
	}
	return k, &want, check
}

func testQueue(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k, want, check := queueFixture(t, s)

	noErr(t, "SetQueue(hub-1)", s.SetQueue(ctx, k, "hub-1", at(time.Second)))
	want.QueueInstance, want.QueueAttachedAt = "hub-1", at(time.Second)
	check("after SetQueue(hub-1)")

	// A newer attach elsewhere.
	noErr(t, "SetQueue(hub-2)", s.SetQueue(ctx, k, "hub-2", at(2*time.Second)))
	want.QueueInstance, want.QueueAttachedAt = "hub-2", at(2*time.Second)
	check("after SetQueue(hub-2)")

	// The stale instance's detach does nothing.
	ok, err := s.ClearQueue(ctx, k, "hub-1", at(time.Second), at(3*time.Second))
	noErr(t, "ClearQueue(stale)", err)
	if ok {
		t.Fatal("ClearQueue(stale instance) = true, want false")
	}
	check("after a stale ClearQueue")

	ok, err = s.ClearQueue(ctx, k, "hub-2", at(2*time.Second), at(4*time.Second))
	noErr(t, "ClearQueue(holder)", err)
	if !ok {
		t.Fatal("ClearQueue(holder) = false, want true")
	}
	want.QueueInstance, want.QueueAttachedAt, want.QueueDetachedAt = "", time.Time{}, at(4*time.Second)
	check("after ClearQueue(holder)")

	ok, err = s.ClearQueue(ctx, k, "hub-2", at(2*time.Second), at(5*time.Second))
	noErr(t, "ClearQueue again", err)
	if ok {
		t.Fatal("ClearQueue again = true, want false")
	}
	check("after a second ClearQueue")

	wantErr(t, "SetQueue(unknown)", s.SetQueue(ctx, key("t", "p", "nobody"), "hub-1", t0), sessionstore.ErrNotFound)
	// ClearQueue lists no error for an unknown key: it cleared nothing.
	ok, err = s.ClearQueue(ctx, key("t", "p", "nobody"), "hub-1", t0, t0)
	if ok || err != nil {
		t.Fatalf("ClearQueue(unknown) = %v, %v; want false, nil", ok, err)
	}
}

func testQueueCompareAndSet(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k, want, check := queueFixture(t, s)

	// hub-2's attach at 2s lands first; hub-1's older attach (1s) lands late.
	noErr(t, "SetQueue(hub-2, 2s)", s.SetQueue(ctx, k, "hub-2", at(2*time.Second)))
	noErr(t, "late SetQueue(hub-1, 1s)", s.SetQueue(ctx, k, "hub-1", at(time.Second)))
	want.QueueInstance, want.QueueAttachedAt = "hub-2", at(2*time.Second)
	check("after a late SetQueue of an older attach")

	// A second connection on the same instance replaced the first; the
	// first one's detach comes after: it must not clear the second.
	noErr(t, "SetQueue(hub-2, 3s)", s.SetQueue(ctx, k, "hub-2", at(3*time.Second)))
	ok, err := s.ClearQueue(ctx, k, "hub-2", at(2*time.Second), at(4*time.Second))
	noErr(t, "ClearQueue(hub-2's replaced attach)", err)
	if ok {
		t.Fatal("ClearQueue of a replaced attach on the same instance = true, want false")
	}
	want.QueueAttachedAt = at(3 * time.Second)
	check("after the replaced attach's ClearQueue")

	// The holder detaches at 5s; a SetQueue of its own attach (3s) arriving
	// after that names no instance again.
	ok, err = s.ClearQueue(ctx, k, "hub-2", at(3*time.Second), at(5*time.Second))
	noErr(t, "ClearQueue(holder)", err)
	if !ok {
		t.Fatal("ClearQueue(holder) = false, want true")
	}
	noErr(t, "SetQueue after its detach", s.SetQueue(ctx, k, "hub-2", at(3*time.Second)))
	want.QueueInstance, want.QueueAttachedAt, want.QueueDetachedAt = "", time.Time{}, at(5*time.Second)
	check("after a SetQueue that arrived after its own detach")

	// A new attach after the detach is recorded.
	noErr(t, "SetQueue(hub-1, 6s)", s.SetQueue(ctx, k, "hub-1", at(6*time.Second)))
	want.QueueInstance, want.QueueAttachedAt = "hub-1", at(6*time.Second)
	check("after a new attach")
}

func testAssignInstance(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreate(t, s, k)
	for _, inst := range []string{"hub-1", "hub-2", ""} {
		noErr(t, "AssignInstance", s.AssignInstance(ctx, k, inst))
		got, err := s.GetSession(ctx, k, t0)
		noErr(t, "GetSession", err)
		if got.AssignedInstance != inst {
			t.Fatalf("AssignedInstance = %q, want %q", got.AssignedInstance, inst)
		}
	}
	wantErr(t, "AssignInstance(unknown)", s.AssignInstance(ctx, key("t", "p", "nobody"), "hub-1"), sessionstore.ErrNotFound)
}

func testReassignInstance(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	other := key("t", "p", "bob")
	mustCreate(t, s, k)
	mustCreate(t, s, other)
	noErr(t, "AssignInstance", s.AssignInstance(ctx, other, "hub-1"))
	wantAssigned := func(k sessionstore.Key, want string) {
		t.Helper()
		got, err := s.GetSession(ctx, k, t0)
		noErr(t, "GetSession", err)
		if got.AssignedInstance != want {
			t.Fatalf("AssignedInstance of %s = %q, want %q", k.SessionID, got.AssignedInstance, want)
		}
	}
	steps := []struct {
		from, to string
		moved    bool
		after    string
	}{
		{"hub-1", "hub-2", false, ""}, // unassigned: "hub-1" is stale
		{"", "hub-1", true, "hub-1"},  // first placement
		{"", "hub-2", false, "hub-1"}, // placed meanwhile
		{"hub-1", "hub-2", true, "hub-2"},
		{"hub-1", "hub-3", false, "hub-2"}, // lost the race to hub-2
		{"hub-2", "hub-2", true, "hub-2"},  // a takeover on the same instance
	}
	for _, st := range steps {
		moved, err := s.ReassignInstance(ctx, k, st.from, st.to)
		noErr(t, fmt.Sprintf("ReassignInstance(%q -> %q)", st.from, st.to), err)
		if moved != st.moved {
			t.Fatalf("ReassignInstance(%q -> %q) moved = %v, want %v", st.from, st.to, moved, st.moved)
		}
		wantAssigned(k, st.after)
	}
	wantAssigned(other, "hub-1") // the key names one session only
	_, err := s.ReassignInstance(ctx, key("t", "p", "nobody"), "", "hub-1")
	wantErr(t, "ReassignInstance(unknown)", err, sessionstore.ErrNotFound)
	_, err = s.ReassignInstance(ctx, key("t", "p", "nobody"), "hub-1", "hub-2")
	wantErr(t, "ReassignInstance(unknown, stale from)", err, sessionstore.ErrNotFound)
}

// testReassignConcurrent is the takeover race: the assigned instance died
// and several instances, having read the same assignment, move it at once.
func testReassignConcurrent(t *testing.T, s sessionstore.Store) {
	const racers = 16
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreate(t, s, k)
	noErr(t, "AssignInstance", s.AssignInstance(ctx, k, "a"))

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []string
		errs    []error
	)
	start := make(chan struct{})
	for g := range racers {
		wg.Go(func() {
			to := fmt.Sprintf("hub-%02d", g)
			<-start
			moved, err := s.ReassignInstance(ctx, k, "a", to)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case moved:
				winners = append(winners, to)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d concurrent reassignments failed, first: %v", len(errs), errs[0])
	}
	if len(winners) != 1 {
		t.Fatalf("%d racers moved the assignment (%v), want exactly 1", len(winners), winners)
	}
	got, err := s.GetSession(ctx, k, t0)
	noErr(t, "GetSession", err)
	if got.AssignedInstance != winners[0] {
		t.Fatalf("AssignedInstance = %q, want the winner %q", got.AssignedInstance, winners[0])
	}
}

func testAPIKeys(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	want := sessionstore.APIKey{Hash: hash("key-1"), TenantID: "t", ProjectID: "p", CreatedAt: at(time.Second)}
	noErr(t, "PutAPIKey", s.PutAPIKey(ctx, want))
	noErr(t, "PutAPIKey(another)", s.PutAPIKey(ctx, sessionstore.APIKey{Hash: hash("key-2"), TenantID: "t", ProjectID: "q", CreatedAt: t0}))

	check := func(what string) {
		t.Helper()
		got, err := s.APIKeyByHash(ctx, hash("key-1"))
		noErr(t, what, err)
		if !bytes.Equal(got.Hash, want.Hash) || got.TenantID != want.TenantID ||
			got.ProjectID != want.ProjectID || !got.CreatedAt.Equal(want.CreatedAt) {
			t.Fatalf("%s = %+v, want %+v", what, got, want)
		}
	}
	check("APIKeyByHash")

	err := s.PutAPIKey(ctx, sessionstore.APIKey{Hash: hash("key-1"), TenantID: "x", ProjectID: "y", CreatedAt: at(time.Hour)})
	wantErr(t, "PutAPIKey(same hash)", err, sessionstore.ErrConflict)
	check("APIKeyByHash after the conflict")

	_, err = s.APIKeyByHash(ctx, hash("nope"))
	wantErr(t, "APIKeyByHash(unknown)", err, sessionstore.ErrNotFound)

	gone, err := s.DeleteAPIKey(ctx, hash("key-1"))
	noErr(t, "DeleteAPIKey", err)
	if !bytes.Equal(gone.Hash, want.Hash) || gone.TenantID != want.TenantID || gone.ProjectID != want.ProjectID {
		t.Fatalf("DeleteAPIKey = %+v, want %+v", gone, want)
	}
	_, err = s.APIKeyByHash(ctx, hash("key-1"))
	wantErr(t, "APIKeyByHash(deleted)", err, sessionstore.ErrNotFound)
	_, err = s.DeleteAPIKey(ctx, hash("key-1"))
	wantErr(t, "DeleteAPIKey(again)", err, sessionstore.ErrNotFound)
	if _, err := s.APIKeyByHash(ctx, hash("key-2")); err != nil {
		t.Fatalf("APIKeyByHash(the other key) after a delete: %v", err)
	}
}

func testNoAliasing(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	in := newSession(k, hash("h"), at(time.Hour))
	out, err := s.CreateSession(ctx, in, t0)
	noErr(t, "CreateSession", err)
	in.TokenHash[0] ^= 0xff
	out.TokenHash[1] ^= 0xff
	got, err := s.SessionByToken(ctx, hash("h"), t0)
	noErr(t, "SessionByToken after mutating the caller's slices", err)
	got.TokenHash[2] ^= 0xff
	got, err = s.GetSession(ctx, k, t0)
	noErr(t, "GetSession", err)
	if !bytes.Equal(got.TokenHash, hash("h")) {
		t.Fatalf("stored TokenHash = %x, want %x", got.TokenHash, hash("h"))
	}

	apiHash := hash("api")
	noErr(t, "PutAPIKey", s.PutAPIKey(ctx, sessionstore.APIKey{Hash: apiHash, TenantID: "t", ProjectID: "p", CreatedAt: t0}))
	apiHash[0] ^= 0xff
	ak, err := s.APIKeyByHash(ctx, hash("api"))
	noErr(t, "APIKeyByHash after mutating the caller's slice", err)
	ak.Hash[0] ^= 0xff
	ak, err = s.APIKeyByHash(ctx, hash("api"))
	noErr(t, "APIKeyByHash after mutating a returned slice", err)
	if !bytes.Equal(ak.Hash, hash("api")) {
		t.Fatalf("stored API key hash = %x", ak.Hash)
	}

	ns := send(k, "sender")
	ns.Payload = json.RawMessage(`{"text":"hello"}`)
	sig := mustAppend(t, s, ns)
	copy(ns.Payload, `{"text":"HELLO"}`)
	copy(sig.Payload, `{"text":"WORLD"}`)
	pend, err := s.PendingSignals(ctx, k, 0, 10)
	noErr(t, "PendingSignals", err)
	copy(pend[0].Payload, `{"text":"AGAIN"}`)
	pend, err = s.PendingSignals(ctx, k, 0, 10)
	noErr(t, "PendingSignals", err)
	if !sameJSON(pend[0].Payload, []byte(`{"text":"hello"}`)) {
		t.Fatalf("stored payload = %s, want {\"text\":\"hello\"}", pend[0].Payload)
	}
}

func testAppendSeq(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	a, b := key("t", "p", "alice"), key("t", "p", "bob")
	mustCreate(t, s, a)
	mustCreate(t, s, b)
	mustCreate(t, s, key("t", "p", "carol"))

	var wantA, wantB []sessionstore.Signal
	for i := range 5 {
		for _, to := range []sessionstore.Key{a, b} {
			ns := send(to, "carol")
			ns.Kind = fmt.Sprintf("kind-%d", i)
			ns.Payload = json.RawMessage(fmt.Sprintf(`{"i":%d,"to":%q}`, i, to.SessionID))
			ns.CreatedAt = at(time.Duration(i)*time.Second + 17*time.Microsecond)
			ns.IdempotencyKey = fmt.Sprintf("key-%s-%d", to.SessionID, i)
			ns.Delivery, ns.RouteState = "delivered", "route_without_queue"
			sig := mustAppend(t, s, ns)
			want := expected(ns, int64(i+1))
			wantSignal(t, "AppendSignal result", sig, want)
			if to == a {
				wantA = append(wantA, want)
			} else {
				wantB = append(wantB, want)
			}
		}
	}
	for _, c := range []struct {
		k    sessionstore.Key
		want []sessionstore.Signal
	}{{a, wantA}, {b, wantB}} {
		got, err := s.PendingSignals(ctx, c.k, 0, 100)
		noErr(t, "PendingSignals", err)
		wantInt(t, "pending count", len(got), len(c.want))
		for i := range got {
			wantSignal(t, fmt.Sprintf("pending[%d] of %s", i, c.k.SessionID), got[i], c.want[i])
		}
	}
}

func testAppendNotFound(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	_, _, err := s.AppendSignal(ctx, send(key("t", "p", "nobody"), "x"), t0)
	wantErr(t, "AppendSignal(unknown)", err, sessionstore.ErrNotFound)

	k := key("t", "p", "alice")
	mustCreateSession(t, s, newSession(k, hash("h"), at(time.Minute)))
	ns := send(k, "x")
	ns.CreatedAt = at(2 * time.Minute)
	_, _, err = s.AppendSignal(ctx, ns, at(2*time.Minute))
	wantErr(t, "AppendSignal(expired)", err, sessionstore.ErrNotFound)
	wantCount(t, s, k, 0)
}

func testAppendIdempotency(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	to := key("t", "p", "bob")
	mustCreate(t, s, to)
	mustCreate(t, s, key("t", "p", "alice"))
	mustCreate(t, s, key("t", "p", "carol"))

	sendKey := func(from, idem string, created, since time.Time, payload string) (sessionstore.Signal, bool) {
		t.Helper()
		ns := send(to, from)
		ns.IdempotencyKey = idem
		ns.CreatedAt = created
		ns.IdempotencySince = since
		ns.Payload = json.RawMessage(payload)
		sig, dup, err := s.AppendSignal(ctx, ns, created)
		noErr(t, "AppendSignal", err)
		return sig, dup
	}

	first, dup := sendKey("alice", "k1", t0, at(-10*time.Minute), `{"v":"first"}`)
	if dup || first.Seq != 1 {
		t.Fatalf("first send: seq %d duplicate %v, want 1 false", first.Seq, dup)
	}

	// Same sender, same key, inside the window: the first signal, nothing stored.
	again, dup := sendKey("alice", "k1", at(time.Minute), at(-9*time.Minute), `{"v":"second"}`)
	if !dup {
		t.Fatal("repeat within the window: duplicate = false, want true")
	}
	wantSignal(t, "duplicate answer", again, first)
	wantCount(t, s, to, 1)

	// The window is inclusive: since == the first signal's CreatedAt is still a duplicate.
	again, dup = sendKey("alice", "k1", at(time.Minute), t0, `{"v":"third"}`)
	if !dup {
		t.Fatal("repeat with since == first CreatedAt: duplicate = false, want true")
	}
	wantSignal(t, "duplicate answer (inclusive window)", again, first)
	wantCount(t, s, to, 1)

	// Another sender with the same key is a new signal.
	other, dup := sendKey("carol", "k1", at(2*time.Minute), at(-8*time.Minute), `{}`)
	if dup || other.Seq != 2 {
		t.Fatalf("other sender: seq %d duplicate %v, want 2 false", other.Seq, dup)
	}
	// Same sender, another key.
	k2, dup := sendKey("alice", "k2", at(3*time.Minute), at(-7*time.Minute), `{}`)
	if dup || k2.Seq != 3 {
		t.Fatalf("other key: seq %d duplicate %v, want 3 false", k2.Seq, dup)
	}
	// No key: never a duplicate.
	for i, want := range []int64{4, 5} {
		sig, dup := sendKey("alice", "", at(4*time.Minute), at(-6*time.Minute), `{}`)
		if dup || sig.Seq != want {
			t.Fatalf("keyless send %d: seq %d duplicate %v, want %d false", i, sig.Seq, dup, want)
		}
	}
	// Outside the window (since after the first's CreatedAt): a new signal.
	late, dup := sendKey("alice", "k1", at(5*time.Minute), at(time.Microsecond), `{}`)
	if dup || late.Seq != 6 {
		t.Fatalf("repeat outside the window: seq %d duplicate %v, want 6 false", late.Seq, dup)
	}
	wantCount(t, s, to, 6)

	// An acknowledged signal keeps its idempotency key.
	n, err := s.AckSignals(ctx, to, 6, at(6*time.Minute))
	noErr(t, "AckSignals", err)
	wantInt(t, "acked", n, 6)
	again, dup = sendKey("alice", "k2", at(7*time.Minute), at(-time.Minute), `{}`)
	if !dup {
		t.Fatal("repeat of an acknowledged signal: duplicate = false, want true")
	}
	wantInt(t, "seq of the duplicate of an acked signal", again.Seq, 3)
	if again.ID != k2.ID {
		t.Fatalf("duplicate answered id %s, want %s", again.ID, k2.ID)
	}
	wantCount(t, s, to, 0)
}

func testAppendPayload(t *testing.T, s sessionstore.Store) {
	k := key("t", "p", "alice")
	mustCreate(t, s, k)
	payloads := []string{
		`{ "b": [1, 2.5, "x", null, false], "a": {"nested": {"deep": true}}, "s": "h\u00e9llo \u2603 \"q\"" }`,
		`[]`,
		`"just a string"`,
		`42`,
		`{"empty":{},"list":[{"k":1},{"k":2}]}`,
	}
	for _, p := range payloads {
		ns := send(k, "x")
		ns.Payload = json.RawMessage(p)
		sig := mustAppend(t, s, ns)
		if !sameJSON(sig.Payload, []byte(p)) {
			t.Errorf("AppendSignal payload = %s, want %s", sig.Payload, p)
		}
	}
	got, err := s.PendingSignals(t.Context(), k, 0, 100)
	noErr(t, "PendingSignals", err)
	wantInt(t, "pending", len(got), len(payloads))
	for i, p := range payloads {
		if !sameJSON(got[i].Payload, []byte(p)) {
			t.Errorf("pending[%d] payload = %s, want %s", i, got[i].Payload, p)
		}
	}
}

func testAppendPayloadBytes(t *testing.T, s sessionstore.Store) {
	// Clients dedupe by signal id, so a replay must carry exactly the bytes
	// of the live push: a store keeps the sender's text, byte for byte. A
	// store that re-encodes JSON (Postgres jsonb) reorders keys, drops
	// duplicate keys and whitespace, refuses \u0000 and expands exponents.
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreate(t, s, k)
	payloads := []string{
		`{"b":1, "a":1}`,
		`{"a":1,"a":2}`,
		`[1e400]`,
		`[1e131071, 1e131071]`,
		`"\u0000"`,
		`{"s":"nul \u0000 inside"}`,
		"{ \"outer\" :\n\t[ 1 ,\t{\"inner\" : { } } ,  \"x\"\r\n ]  }",
		` 42 `,
		`1.50`,
		`"\u00e9 vs é"`,
	}
	sent := make([]sessionstore.NewSignal, len(payloads))
	for i, p := range payloads {
		ns := send(k, "x")
		ns.Payload = json.RawMessage(p)
		ns.IdempotencyKey = fmt.Sprintf("k%d", i)
		sent[i] = ns
		sig := mustAppend(t, s, ns)
		if !bytes.Equal(sig.Payload, []byte(p)) {
			t.Errorf("AppendSignal payload = %q, want %q", sig.Payload, p)
		}
	}
	got, err := s.PendingSignals(ctx, k, 0, 100)
	noErr(t, "PendingSignals", err)
	wantInt(t, "pending", len(got), len(payloads))
	for i, p := range payloads {
		if !bytes.Equal(got[i].Payload, []byte(p)) {
			t.Errorf("pending[%d] payload = %q, want %q", i, got[i].Payload, p)
		}
	}
	// A duplicate answers with the stored signal: the same bytes again.
	for i, p := range payloads {
		sig, dup, err := s.AppendSignal(ctx, sent[i], t0)
		noErr(t, "AppendSignal(duplicate)", err)
		if !dup {
			t.Fatalf("repeat of key %q: duplicate = false, want true", sent[i].IdempotencyKey)
		}
		if !bytes.Equal(sig.Payload, []byte(p)) {
			t.Errorf("duplicate's payload = %q, want %q", sig.Payload, p)
		}
	}
}

func testAppendConcurrent(t *testing.T, s sessionstore.Store) {
	const senders, each = 20, 20
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreate(t, s, k)

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		got  []int64
		errs []error
	)
	for g := range senders {
		wg.Go(func() {
			for i := range each {
				ns := send(k, fmt.Sprintf("sender%02d", g))
				ns.Payload = json.RawMessage(fmt.Sprintf(`{"g":%d,"i":%d}`, g, i))
				sig, _, err := s.AppendSignal(ctx, ns, t0)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					got = append(got, sig.Seq)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d concurrent appends failed, first: %v", len(errs), errs[0])
	}
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	want := make([]int64, senders*each)
	for i := range want {
		want[i] = int64(i + 1)
	}
	wantSeqs(t, "sorted seqs of concurrent appends", got, want)
	wantPending(t, s, k, want...)
}

func testPending(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreate(t, s, k)
	appendN(t, s, k, 6)

	pending := func(after int64, limit int) []int64 {
		t.Helper()
		got, err := s.PendingSignals(ctx, k, after, limit)
		noErr(t, "PendingSignals", err)
		return seqs(got)
	}
	wantSeqs(t, "after 2, limit 10", pending(2, 10), []int64{3, 4, 5, 6})
	wantSeqs(t, "after 0, limit 2", pending(0, 2), []int64{1, 2})
	wantSeqs(t, "after 6", pending(6, 10), nil)

	n, err := s.AckSignals(ctx, k, 3, t0)
	noErr(t, "AckSignals", err)
	wantInt(t, "acked", n, 3)
	wantSeqs(t, "after 0 with 1..3 acked", pending(0, 10), []int64{4, 5, 6})
	wantSeqs(t, "after 4, limit 1", pending(4, 1), []int64{5})
	wantSeqs(t, "after 1, limit 2, 1..3 acked", pending(1, 2), []int64{4, 5})

	got, err := s.PendingSignals(ctx, key("t", "p", "nobody"), 0, 10)
	noErr(t, "PendingSignals(unknown) lists no error", err)
	wantInt(t, "pending of an unknown key", len(got), 0)
}

func testAck(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreate(t, s, k)
	appendN(t, s, k, 5)
	for _, c := range []struct {
		upTo      int64
		acked     int
		remaining int
	}{{2, 2, 3}, {2, 0, 3}, {1, 0, 3}, {4, 2, 1}, {100, 1, 0}, {100, 0, 0}} {
		n, err := s.AckSignals(ctx, k, c.upTo, at(time.Minute))
		noErr(t, "AckSignals", err)
		wantInt(t, fmt.Sprintf("AckSignals(up to %d)", c.upTo), n, c.acked)
		wantCount(t, s, k, c.remaining)
	}
	n, err := s.AckSignals(ctx, key("t", "p", "nobody"), 10, t0)
	noErr(t, "AckSignals(unknown) lists no error", err)
	wantInt(t, "acked for an unknown key", n, 0)
}

func testDropPending(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreate(t, s, k)
	wantCount(t, s, k, 0)
	appendN(t, s, k, 4)
	wantCount(t, s, k, 4)
	_, err := s.AckSignals(ctx, k, 1, t0)
	noErr(t, "AckSignals", err)
	wantCount(t, s, k, 3)

	n, err := s.DropPending(ctx, k, at(time.Minute))
	noErr(t, "DropPending", err)
	wantInt(t, "dropped", n, 3)
	wantCount(t, s, k, 0)
	wantPending(t, s, k)
	n, err = s.DropPending(ctx, k, at(time.Minute))
	noErr(t, "DropPending again", err)
	wantInt(t, "dropped again", n, 0)

	// Dropping acknowledges; seq goes on.
	sig := mustAppend(t, s, send(k, "x"))
	wantInt(t, "seq after drop", sig.Seq, 5)
	wantCount(t, s, k, 1)
	n, err = s.CountPending(ctx, key("t", "p", "nobody"))
	noErr(t, "CountPending(unknown) lists no error", err)
	wantInt(t, "pending of an unknown key", n, 0)
}

func testPendingTotal(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	total := func(now time.Time) int {
		t.Helper()
		n, err := s.PendingTotal(ctx, now)
		noErr(t, "PendingTotal", err)
		return n
	}
	wantInt(t, "pending total of an empty store", total(t0), 0)
	a, b := key("t", "p", "a"), key("u", "q", "b")
	mustCreate(t, s, a)
	mustCreate(t, s, b)
	short := key("t", "p", "short")
	mustCreateSession(t, s, newSession(short, hash("short"), at(time.Hour)))
	appendN(t, s, a, 3)
	appendN(t, s, b, 2)
	appendN(t, s, short, 4)
	_, err := s.AckSignals(ctx, a, 1, t0)
	noErr(t, "AckSignals", err)
	wantInt(t, "pending total, all live", total(t0), 2+2+4)
	// After short's expiry its signals no longer count.
	wantInt(t, "pending total after one expired", total(at(2*time.Hour)), 2+2)
}

// testPendingCountsAgree: the counts (which a store may keep apart from the
// signals, as last seq minus acknowledged seq) are what PendingSignals lists,
// after each way a signal comes or goes: appends, a duplicate and a refused
// append (nothing stored), acks, DropPending, Prune of acknowledged signals,
// expiry, Prune of an expired session, a registration again of an expired
// id, and DeleteSession.
func testPendingCountsAgree(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	a, b, c := key("t", "p", "a"), key("t", "p", "b"), key("u", "q", "c")
	short := key("t", "p", "short")
	all := []sessionstore.Key{a, b, c, short}
	expiry := map[sessionstore.Key]time.Time{}
	create := func(k sessionstore.Key, expires time.Time) {
		t.Helper()
		mustCreateSession(t, s, newSession(k, hash(fmt.Sprint(k, expires)), expires))
		expiry[k] = expires
	}
	agree := func(step string, now time.Time) {
		t.Helper()
		total := 0
		for _, k := range all {
			listed, err := s.PendingSignals(ctx, k, 0, 100000)
			noErr(t, "PendingSignals", err)
			n, err := s.CountPending(ctx, k)
			noErr(t, "CountPending", err)
			wantInt(t, fmt.Sprintf("after %s: CountPending(%v) against the %d listed", step, k, len(listed)), n, len(listed))
			if e, ok := expiry[k]; ok && !e.Before(now) {
				total += len(listed)
			}
		}
		got, err := s.PendingTotal(ctx, now)
		noErr(t, "PendingTotal", err)
		wantInt(t, fmt.Sprintf("after %s: PendingTotal(%v)", step, now), got, total)
	}
	create(a, at(24*time.Hour))
	create(b, at(24*time.Hour))
	create(c, at(24*time.Hour))
	create(short, at(time.Hour))
	agree("registrations", t0)

	appendN(t, s, a, 5)
	appendN(t, s, b, 3)
	appendN(t, s, c, 2)
	appendN(t, s, short, 4)
	agree("appends", t0)

	first := send(a, "b")
	first.IdempotencyKey = "once"
	mustAppend(t, s, first)
	again := send(a, "b")
	again.IdempotencyKey = "once"
	if _, dup, err := s.AppendSignal(ctx, again, t0); err != nil || !dup {
		t.Fatalf("the repeat of an idempotency key: duplicate %v, %v; want a duplicate", dup, err)
	}
	refused := send(b, "a")
	refused.Limits = sessionstore.Limits{PendingPerRecipient: 3}
	if _, _, err := s.AppendSignal(ctx, refused, t0); !errors.Is(err, sessionstore.ErrQuotaExceeded) {
		t.Fatalf("an append past the pending quota: %v, want ErrQuotaExceeded", err)
	}
	agree("a duplicate and a refused append", t0)

	for _, ack := range []struct {
		k    sessionstore.Key
		upTo int64
	}{{a, 2}, {a, 1}, {b, 3}, {c, 100}} {
		_, err := s.AckSignals(ctx, ack.k, ack.upTo, at(time.Minute))
		noErr(t, "AckSignals", err)
	}
	agree("acks", t0)

	_, err := s.DropPending(ctx, b, at(time.Minute))
	noErr(t, "DropPending", err)
	appendN(t, s, b, 2)
	_, err = s.DropPending(ctx, c, at(time.Minute))
	noErr(t, "DropPending", err)
	agree("DropPending", t0)

	// Acknowledged signals pruned, none of the pending.
	nsig, _, err := s.Prune(ctx, at(2*time.Minute), at(-time.Hour))
	noErr(t, "Prune", err)
	if nsig == 0 {
		t.Fatal("Prune removed no acknowledged signal: the step tests nothing")
	}
	agree("Prune of acknowledged signals", at(3*time.Minute))

	// short expires with its pending signals: no longer in the total, still
	// counted until Prune removes it.
	agree("the expiry of a session", at(2*time.Hour))
	_, nsess, err := s.Prune(ctx, at(2*time.Minute), at(2*time.Hour))
	noErr(t, "Prune", err)
	wantInt(t, "sessions pruned", nsess, 1)
	delete(expiry, short)
	agree("Prune of an expired session", at(2*time.Hour))

	// Its id registered again starts from nothing.
	create(short, at(48*time.Hour))
	agree("a registration again", at(2*time.Hour))
	appendN(t, s, short, 2)
	agree("appends to it", at(2*time.Hour))

	noErr(t, "DeleteSession", s.DeleteSession(ctx, a))
	delete(expiry, a)
	agree("DeleteSession", at(2*time.Hour))
}

// testPruneSignals: Prune deletes the acknowledged signals made before its
// cutoff, whenever they were acknowledged (the idempotency window counts
// from when a signal was made, and no store need remember when a signal was
// acknowledged), and keeps the pending ones, however old, and the
// acknowledged ones made since.
func testPruneSignals(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	k := key("t", "p", "bob")
	mustCreate(t, s, k)
	mustCreate(t, s, key("t", "p", "alice"))
	withKey := func(idem string, made time.Time) sessionstore.NewSignal {
		ns := send(k, "alice")
		ns.IdempotencyKey = idem
		ns.IdempotencySince = at(-time.Hour)
		ns.CreatedAt = made
		return ns
	}
	// Made before the cutoff (2 min): k1, k2 and the pending k5; after it:
	// k3 and k4.
	for i, made := range []time.Time{t0, t0, at(3 * time.Minute), at(3 * time.Minute), t0} {
		mustAppend(t, s, withKey(fmt.Sprintf("k%d", i+1), made))
	}
	_, err := s.AckSignals(ctx, k, 1, at(time.Minute))
	noErr(t, "AckSignals(<=1)", err)
	// k2 is acknowledged after the cutoff; it was made before it.
	_, err = s.AckSignals(ctx, k, 4, at(5*time.Minute))
	noErr(t, "AckSignals(<=4)", err)

	// This prune removes no session, so its signal count is exactly the
	// acknowledged signals it removed.
	nsig, nsess, err := s.Prune(ctx, at(2*time.Minute), at(-time.Hour))
	noErr(t, "Prune", err)
	wantInt(t, "pruned signals", nsig, 2)
	wantInt(t, "pruned sessions", nsess, 0)
	wantPending(t, s, k, 5)
	wantCount(t, s, k, 1)

	// Pruned signals lost their idempotency keys; kept acked ones did not.
	sig, dup, err := s.AppendSignal(ctx, withKey("k3", t0), t0)
	noErr(t, "AppendSignal(k3)", err)
	if !dup || sig.Seq != 3 {
		t.Fatalf("repeat of kept acked k3: seq %d duplicate %v, want 3 true", sig.Seq, dup)
	}
	for _, idem := range []string{"k1", "k2"} {
		sig, dup, err = s.AppendSignal(ctx, withKey(idem, at(4*time.Minute)), t0)
		noErr(t, "AppendSignal("+idem+")", err)
		if dup {
			t.Fatalf("repeat of pruned %s: seq %d duplicate %v, want a new signal", idem, sig.Seq, dup)
		}
	}

	// Nothing acknowledged made before the cutoff: nothing goes.
	nsig, nsess, err = s.Prune(ctx, at(2*time.Minute), at(-time.Hour))
	noErr(t, "Prune again", err)
	wantInt(t, "pruned signals again", nsig, 0)
	wantInt(t, "pruned sessions again", nsess, 0)
	wantPending(t, s, k, 5, 6, 7)
}

func testPruneSeqContinues(t *testing.T, s sessionstore.Store) {
	// Seq is per recipient for the life of the session, not max(seq)+1 of
	// the rows that happen to remain: a client's after-seq cursor must never
	// see a seq again.
	ctx := t.Context()
	k := key("t", "p", "alice")
	mustCreate(t, s, k)
	appendN(t, s, k, 3)
	_, err := s.AckSignals(ctx, k, 3, t0)
	noErr(t, "AckSignals", err)
	nsig, _, err := s.Prune(ctx, at(time.Minute), at(-time.Hour))
	noErr(t, "Prune", err)
	wantInt(t, "pruned signals", nsig, 3)
	sig := mustAppend(t, s, send(k, "x"))
	wantInt(t, "seq after pruning every signal", sig.Seq, 4)
}

func testPruneSessions(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	gone, kept := key("t", "p", "gone"), key("t", "p", "kept")
	mustCreateSession(t, s, newSession(gone, hash("gone"), at(30*time.Minute)))
	mustCreateSession(t, s, newSession(kept, hash("kept"), at(24*time.Hour)))
	appendN(t, s, gone, 2)
	appendN(t, s, kept, 1)

	// Expired, but not before the cutoff: kept.
	_, nsess, err := s.Prune(ctx, at(-time.Hour), at(10*time.Minute))
	noErr(t, "Prune(early cutoff)", err)
	wantInt(t, "pruned sessions (early cutoff)", nsess, 0)
	_, err = s.GetSession(ctx, gone, t0)
	noErr(t, "GetSession(gone) before its prune", err)

	// How many of an expired session's own signals count in the signals
	// result is not pinned; only the sessions count is.
	_, nsess, err = s.Prune(ctx, at(-time.Hour), at(time.Hour))
	noErr(t, "Prune", err)
	wantInt(t, "pruned sessions", nsess, 1)

	// Gone for real, even at a now before its expiry.
	_, err = s.GetSession(ctx, gone, t0)
	wantErr(t, "GetSession(pruned) at a now before its expiry", err, sessionstore.ErrNotFound)
	wantPending(t, s, gone)
	wantCount(t, s, gone, 0)
	wantErr(t, "DeleteSession(pruned)", s.DeleteSession(ctx, gone), sessionstore.ErrNotFound)

	_, err = s.GetSession(ctx, kept, t0)
	noErr(t, "GetSession(kept)", err)
	wantPending(t, s, kept, 1)
}

func testPruneBacklog(t *testing.T, s sessionstore.Store) {
	// A store may delete in batches (pgstore does, and runs this suite with a
	// batch of a few rows); however it does, one Prune removes the whole
	// backlog and counts all of it. 24 signals and 7 sessions: one is a
	// multiple of a small batch and the other is not.
	ctx := t.Context()
	const perSession, expired = 8, 7
	live := []sessionstore.Key{key("t", "p", "a"), key("t", "p", "b"), key("t", "q", "a")}
	acked := perSession * len(live)
	for _, k := range live {
		mustCreate(t, s, k)
		appendN(t, s, k, perSession+1)
		_, err := s.AckSignals(ctx, k, perSession, at(time.Minute))
		noErr(t, "AckSignals", err)
	}
	var gone []sessionstore.Key
	for i := range expired {
		k := key("t", "p", fmt.Sprintf("gone-%d", i))
		mustCreateSession(t, s, newSession(k, hash(k.SessionID), at(30*time.Minute)))
		appendN(t, s, k, 3)
		gone = append(gone, k)
	}

	// No session expired before the cutoff: the count is exactly the
	// acknowledged signals.
	nsig, nsess, err := s.Prune(ctx, at(2*time.Minute), at(-time.Hour))
	noErr(t, "Prune(acked)", err)
	wantInt(t, "pruned signals", nsig, acked)
	wantInt(t, "pruned sessions", nsess, 0)
	for _, k := range live {
		wantPending(t, s, k, perSession+1)
	}

	_, nsess, err = s.Prune(ctx, at(2*time.Minute), at(time.Hour))
	noErr(t, "Prune(expired)", err)
	wantInt(t, "pruned sessions", nsess, expired)
	for _, k := range gone {
		_, err := s.GetSession(ctx, k, t0)
		wantErr(t, fmt.Sprintf("GetSession(%v) after its prune", k), err, sessionstore.ErrNotFound)
		wantCount(t, s, k, 0)
	}
	for _, k := range live {
		_, err := s.GetSession(ctx, k, t0)
		noErr(t, "GetSession(live)", err)
		wantPending(t, s, k, perSession+1)
	}

	// Nothing left to prune.
	nsig, nsess, err = s.Prune(ctx, at(2*time.Minute), at(time.Hour))
	noErr(t, "Prune(again)", err)
	wantInt(t, "pruned signals again", nsig, 0)
	wantInt(t, "pruned sessions again", nsess, 0)
}

func testInstances(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	list, err := s.ListInstances(ctx)
	noErr(t, "ListInstances(empty)", err)
	wantInt(t, "instances in a new store", len(list), 0)

	i2 := sessionstore.Instance{ID: "hub-2", URL: "http://hub-2:8080", StartedAt: t0, LastHeartbeatAt: at(time.Second)}
	i1 := sessionstore.Instance{ID: "hub-1", URL: "http://hub-1:8080", StartedAt: at(-time.Hour), LastHeartbeatAt: at(2 * time.Second)}
	noErr(t, "HeartbeatInstance(hub-2)", s.HeartbeatInstance(ctx, i2))
	noErr(t, "HeartbeatInstance(hub-1)", s.HeartbeatInstance(ctx, i1))
	check := func(what string, want ...sessionstore.Instance) {
		t.Helper()
		got, err := s.ListInstances(ctx)
		noErr(t, what, err)
		if len(got) != len(want) {
			t.Fatalf("%s: %d instances, want %d", what, len(got), len(want))
		}
		for i := range got {
			g, w := got[i], want[i]
			if g.ID != w.ID || g.URL != w.URL || g.Draining != w.Draining ||
				!g.StartedAt.Equal(w.StartedAt) || !g.LastHeartbeatAt.Equal(w.LastHeartbeatAt) ||
				g.BusKeyVersion != w.BusKeyVersion {
				t.Fatalf("%s: instance %d = %+v, want %+v", what, i, g, w)
			}
		}
	}
	check("ListInstances", i1, i2)

	i1.Draining = true
	i1.URL = "http://hub-1:9090"
	i1.LastHeartbeatAt = at(time.Minute)
	noErr(t, "HeartbeatInstance(hub-1 again)", s.HeartbeatInstance(ctx, i1))
	check("ListInstances after an update", i1, i2)

	// The bus key version each heartbeat carries is the one listed: a
	// rotation picked up shows at the next heartbeat, and a heartbeat that
	// knows none (0: not read yet, or a store without a bus key) is
	// unknown again, never the version an earlier heartbeat wrote.
	i1.BusKeyVersion, i2.BusKeyVersion = 1, 2
	noErr(t, "HeartbeatInstance(hub-1, bus key 1)", s.HeartbeatInstance(ctx, i1))
	noErr(t, "HeartbeatInstance(hub-2, bus key 2)", s.HeartbeatInstance(ctx, i2))
	check("ListInstances with bus key versions", i1, i2)
	i1.BusKeyVersion = 2
	noErr(t, "HeartbeatInstance(hub-1, bus key 2)", s.HeartbeatInstance(ctx, i1))
	check("ListInstances after hub-1 picked up a rotation", i1, i2)
	i2.BusKeyVersion = 0
	noErr(t, "HeartbeatInstance(hub-2, no bus key)", s.HeartbeatInstance(ctx, i2))
	check("ListInstances after hub-2's heartbeat without a bus key", i1, i2)
}

func testPruneInstances(t *testing.T, s sessionstore.Store) {
	// With a new instance id per process (the default: the host name, new
	// per pod) the registry, the fabric summary and the health gauge's label
	// set would grow without bound if dead instances were never pruned.
	ctx := t.Context()
	cutoff := at(time.Hour)
	hb := func(id string, last time.Time) sessionstore.Instance {
		in := sessionstore.Instance{ID: id, URL: "http://" + id + ":8080", StartedAt: t0, LastHeartbeatAt: last}
		noErr(t, "HeartbeatInstance("+id+")", s.HeartbeatInstance(ctx, in))
		return in
	}
	for i := range 6 {
		hb(fmt.Sprintf("dead-%d", i), at(time.Duration(i)*time.Minute))
	}
	hb("just-before", cutoff.Add(-time.Microsecond))
	atCutoff := hb("at-cutoff", cutoff)
	alive := hb("alive", at(2*time.Hour))

	_, _, err := s.Prune(ctx, t0, cutoff)
	noErr(t, "Prune", err)
	ids := func() []string {
		t.Helper()
		list, err := s.ListInstances(ctx)
		noErr(t, "ListInstances", err)
		var out []string
		for _, in := range list {
			out = append(out, in.ID)
		}
		return out
	}
	if got, want := ids(), []string{alive.ID, atCutoff.ID}; !reflect.DeepEqual(got, want) {
		t.Fatalf("instances after Prune = %v, want %v (silent since before the cutoff pruned)", got, want)
	}

	// A pruned instance that comes back registers again.
	hb("dead-0", at(3*time.Hour))
	if got, want := ids(), []string{alive.ID, atCutoff.ID, "dead-0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("instances after a pruned one heartbeats again = %v, want %v", got, want)
	}
}

func testFallbacks(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	ev := func(id string, when time.Time) sessionstore.FallbackEvent {
		return sessionstore.FallbackEvent{
			Key: key("t", "p", id), FromInstance: "hub-1", ToInstance: "hub-2",
			RuntimeMode: "sticky", RuntimeModeSource: "explicit", Reason: "instance_dead", At: when,
		}
	}
	// Recorded out of time order on purpose: the list is by At, newest first.
	e1, e3, e2 := ev("s1", at(time.Minute)), ev("s3", at(3*time.Minute)), ev("s2", at(2*time.Minute))
	for _, e := range []sessionstore.FallbackEvent{e1, e3, e2} {
		noErr(t, "RecordFallback", s.RecordFallback(ctx, e))
	}
	check := func(limit int, want ...sessionstore.FallbackEvent) {
		t.Helper()
		got, err := s.ListFallbacks(ctx, limit)
		noErr(t, "ListFallbacks", err)
		if len(got) != len(want) {
			t.Fatalf("ListFallbacks(%d): %d events, want %d", limit, len(got), len(want))
		}
		for i := range got {
			g, w := got[i], want[i]
			if g.Key != w.Key || g.FromInstance != w.FromInstance || g.ToInstance != w.ToInstance ||
				g.RuntimeMode != w.RuntimeMode || g.RuntimeModeSource != w.RuntimeModeSource ||
				g.Reason != w.Reason || !g.At.Equal(w.At) {
				t.Fatalf("ListFallbacks(%d)[%d] = %+v, want %+v", limit, i, g, w)
			}
		}
	}
	check(10, e3, e2, e1)
	check(2, e3, e2)

	c, err := s.Counts(ctx)
	noErr(t, "Counts", err)
	wantInt(t, "Counts.Fallbacks", c.Fallbacks, 3)
}

func testCounts(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	c, err := s.Counts(ctx)
	noErr(t, "Counts(new store)", err)
	if c != (sessionstore.Counts{}) {
		t.Fatalf("Counts of a new store = %+v, want zeros", c)
	}
	adds := []struct {
		c sessionstore.Counter
		n int64
	}{
		{sessionstore.CounterFallbacks, 1},
		{sessionstore.CounterReassignments, 2},
		{sessionstore.CounterAdaptivePlacements, 3},
		{sessionstore.CounterAdaptivePlacementMismatches, 4},
		{sessionstore.CounterReassignments, 10},
		{sessionstore.CounterAdaptivePlacements, 100},
	}
	for _, a := range adds {
		noErr(t, fmt.Sprintf("AddCount(%s)", a.c), s.AddCount(ctx, a.c, a.n))
	}
	c, err = s.Counts(ctx)
	noErr(t, "Counts", err)
	want := sessionstore.Counts{Fallbacks: 1, Reassignments: 12, AdaptivePlacements: 103, AdaptivePlacementMismatches: 4}
	if c != want {
		t.Fatalf("Counts = %+v, want %+v", c, want)
	}
}

func testPruneFallbacks(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	n := sessionstore.KeepFallbackEvents + 5
	for i := range n {
		e := sessionstore.FallbackEvent{
			Key: key("t", "p", fmt.Sprintf("s%d", i)), FromInstance: "a", ToInstance: "b",
			RuntimeMode: "sticky", RuntimeModeSource: "explicit", Reason: "instance_unhealthy",
			At: at(time.Duration(i) * time.Second),
		}
		noErr(t, "RecordFallback", s.RecordFallback(ctx, e))
	}
	_, _, err := s.Prune(ctx, t0, t0)
	noErr(t, "Prune", err)
	got, err := s.ListFallbacks(ctx, 0)
	noErr(t, "ListFallbacks", err)
	wantInt(t, "fallback events kept", len(got), sessionstore.KeepFallbackEvents)
	if got[0].SessionID != fmt.Sprintf("s%d", n-1) || got[len(got)-1].SessionID != "s5" {
		t.Fatalf("kept %s..%s, want s%d..s5", got[0].SessionID, got[len(got)-1].SessionID, n-1)
	}
	c, err := s.Counts(ctx)
	noErr(t, "Counts", err)
	if c.Fallbacks != int64(n) {
		t.Fatalf("Counts.Fallbacks = %d after pruning events, want %d (counters count every event)", c.Fallbacks, n)
	}
}

func testFallbackCounter(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	e := sessionstore.FallbackEvent{
		Key: key("t", "p", "s1"), FromInstance: "hub-1", ToInstance: "hub-1",
		RuntimeMode: "sticky", RuntimeModeSource: "default", Reason: "grace_expired", At: at(time.Minute),
		Counter: sessionstore.CounterReassignments,
	}
	noErr(t, "RecordFallback(reassignment)", s.RecordFallback(ctx, e))
	e.Counter = sessionstore.CounterFallbacks
	noErr(t, "RecordFallback(fallback)", s.RecordFallback(ctx, e))
	c, err := s.Counts(ctx)
	noErr(t, "Counts", err)
	if want := (sessionstore.Counts{Fallbacks: 1, Reassignments: 1}); c != want {
		t.Fatalf("Counts = %+v, want %+v", c, want)
	}
	list, err := s.ListFallbacks(ctx, 0)
	noErr(t, "ListFallbacks", err)
	wantInt(t, "events listed", len(list), 2)
	if e.Counter = "no_such_counter"; s.RecordFallback(ctx, e) == nil {
		t.Fatal("RecordFallback with an unknown counter: no error")
	}
	list, err = s.ListFallbacks(ctx, 0)
	noErr(t, "ListFallbacks", err)
	wantInt(t, "events listed after a refused one", len(list), 2)
}

func testSessionStats(t *testing.T, s sessionstore.Store) {
	ctx := t.Context()
	st, err := s.SessionStats(ctx, t0)
	noErr(t, "SessionStats(empty)", err)
	if st.Total != 0 || st.ByMode == nil || st.BySource == nil || st.ByAssignedInstance == nil || st.ByQueueInstance == nil {
		t.Fatalf("SessionStats of an empty store = %+v, want zero total and non-nil maps", st)
	}
	mk := func(id string, mode marconi.RuntimeMode, source marconi.ModeSource, assigned string, expires time.Time) sessionstore.Key {
		k := key("t", "p", id)
		sess := newSession(k, hash(id), expires)
		sess.RuntimeMode, sess.RuntimeModeSource, sess.AssignedInstance = mode, source, assigned
		mustCreateSession(t, s, sess)
		return k
	}
	a := mk("a", "sticky", "explicit", "hub-1", at(time.Hour))
	mk("b", "sticky", "adaptive-classifier", "hub-1", at(time.Hour))
	mk("c", "sticky", "explicit", "hub-2", at(time.Hour))
	d := mk("d", "stateless", "default", "", at(time.Hour))
	mk("gone", "sticky", "explicit", "hub-2", at(time.Minute)) // expired at the read below
	noErr(t, "SetQueue(a)", s.SetQueue(ctx, a, "hub-2", t0))
	noErr(t, "SetQueue(d)", s.SetQueue(ctx, d, "hub-2", t0))

	st, err = s.SessionStats(ctx, at(2*time.Minute))
	noErr(t, "SessionStats", err)
	wantInt(t, "Total", st.Total, 4)
	if want := (map[marconi.RuntimeMode]int{"sticky": 3, "stateless": 1}); !maps.Equal(st.ByMode, want) {
		t.Errorf("ByMode = %v, want %v", st.ByMode, want)
	}
	if want := (map[marconi.ModeSource]int{"explicit": 2, "adaptive-classifier": 1, "default": 1}); !maps.Equal(st.BySource, want) {
		t.Errorf("BySource = %v, want %v", st.BySource, want)
	}
	for _, c := range []struct {
		what string
		got  map[string]int
		want map[string]int
	}{
		{"ByAssignedInstance", st.ByAssignedInstance, map[string]int{"hub-1": 2, "hub-2": 1}},
		{"ByQueueInstance", st.ByQueueInstance, map[string]int{"hub-2": 2}},
	} {
		if !maps.Equal(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}

	// The canary view: live sessions of one source by client_id and mode.
	mk("e", "stateless", "adaptive-classifier", "", at(time.Hour))
	mk("f", "sticky", "adaptive-classifier", "hub-1", at(time.Minute)) // expired at the read below
	byClient, err := s.CountByClient(ctx, at(2*time.Minute), "adaptive-classifier")
	noErr(t, "CountByClient", err)
	want := map[string]map[marconi.RuntimeMode]int{"client-b": {"sticky": 1}, "client-e": {"stateless": 1}}
	if !maps.EqualFunc(byClient, want, maps.Equal) {
		t.Errorf("CountByClient(adaptive-classifier) = %v, want %v", byClient, want)
	}
	none, err := s.CountByClient(ctx, at(2*time.Minute), "no-such-source")
	noErr(t, "CountByClient(no-such-source)", err)
	if none == nil || len(none) != 0 {
		t.Errorf("CountByClient of an unused source = %v, want an empty, non-nil map", none)
	}
}
