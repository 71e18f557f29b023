package pgstore

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

var _ sessionstore.Store = (*Store)(nil)

// Defaults of the options.
const (
	// DefaultConnectTimeout bounds establishing one connection, so that an
	// unreachable Postgres turns into ErrUnavailable quickly.
	DefaultConnectTimeout = 3 * time.Second
	// DefaultQueryTimeout bounds every call whose context has no earlier
	// deadline, so that a half-open connection cannot hang a caller forever.
	DefaultQueryTimeout = 10 * time.Second
	// DefaultPruneBatch is how many rows one statement of Prune deletes at
	// most: small enough that a batch ends well inside the query timeout.
	DefaultPruneBatch = 5000
	// DefaultMaxBatch is how many appends one group commit carries at most.
	DefaultMaxBatch = 256
	// DefaultBatchesInFlight is how many group commits run at once.
	DefaultBatchesInFlight = 1
	// DefaultAcksPerBatch is how many acknowledgements a group commit
	// carries beside appends and row writes.
	DefaultAcksPerBatch = 4
	// DefaultQuotaLeaseBytes is how many bytes of a project's pending-bytes
	// room a batch lane leases at a time (migration 0015).
	DefaultQuotaLeaseBytes = 1 << 20
	// DefaultAckedPayloadBytes is the largest payload an acknowledged
	// signal keeps until Prune (WithAckedPayloadBytes): about the size of
	// what its row keeps anyway (ids, key, the send's answer, and their
	// index entries), so that what a day of acknowledged signals holds is
	// at most about twice what it held when every payload went at the ack.
	DefaultAckedPayloadBytes = 256
)

// Option tunes Open.
type Option func(*options)

type options struct {
	connectTimeout time.Duration
	queryTimeout   time.Duration
	maxConns       int32
	pruneBatch     int
	groupCommitOff bool
	maxBatch       int
	inFlight       int
	acksPerBatch   int
	leaseBytes     int64
	leaseHolder    string
	ackedPayload   int
	eachAppend     bool
	registerer     prometheus.Registerer
	busKey         BusKeyTimings
}

// WithGroupCommit turns group commit on (the default) or off. Off, every
// append is a transaction of its own: kept to measure what group commit
// gains (MARCONI_GROUP_COMMIT=off).
func WithGroupCommit(on bool) Option {
	return func(o *options) { o.groupCommitOff = !on }
}

// WithMaxBatch sets how many appends one group commit carries at most
// (default DefaultMaxBatch); values below 1 keep the default. At most eight
// times as many appends wait for a batch; more wait for room.
func WithMaxBatch(n int) Option {
	return func(o *options) { o.maxBatch = n }
}

// WithBatchesInFlight sets how many group commits run at once (default
// DefaultBatchesInFlight); values below 1 keep the default. Each holds a
// pooled connection while it runs. A session's writes are in one running
// batch at a time, so they commit in arrival order whatever n.
func WithBatchesInFlight(n int) Option {
	return func(o *options) { o.inFlight = n }
}

// WithAcksPerBatch sets how many acknowledgements a group commit carries
// beside other requests (default DefaultAcksPerBatch): a burst of acks,
// each marking the signals it covers, is spread over the next batches
// instead of holding the appends of one batch until all of it is written.
// When many wait, a batch takes a sixteenth of them if that is more; acks
// go at once when nothing else waits. 0 means no bound; negative values
// keep the default.
func WithAcksPerBatch(n int) Option {
	return func(o *options) {
		if n >= 0 {
			o.acksPerBatch = n
		}
	}
}

// WithStatementPerAppend runs each append of a group commit as a statement
// of its own when on, instead of the batch's appends in one statement (the
// default): kept to measure what the one statement gains, and as a way
// back should it ever plan badly.
func WithStatementPerAppend(on bool) Option {
	return func(o *options) { o.eachAppend = on }
}

// WithAckedPayloadBytes sets the largest payload, in bytes, an
// acknowledged signal keeps with its row until Prune (default
// DefaultAckedPayloadBytes); a larger one is dropped by the ack that passes
// it. An ack otherwise writes no signal (ackSQL): 0 drops every payload at
// the ack, one write more per signal acknowledged (about a tenth more WAL
// per durable send). Negative values keep the default.
func WithAckedPayloadBytes(n int) Option {
	return func(o *options) {
		if n >= 0 {
			o.ackedPayload = n
		}
	}
}

// WithQuotaLease sets how many bytes of a project's pending-bytes room
// each batch lane leases at a time (default DefaultQuotaLeaseBytes): a
// batch whose lane's lease covers its appends settles them without
// locking its projects' counters, so batches of one project commit side
// by side. 0 turns leases off: every batch that appends locks its
// projects' counters until it commits. Negative values keep the default.
// A project can be refused up to the unused leases of the batches running
// at that moment below its limit, never above it.
func WithQuotaLease(bytes int64) Option {
	return func(o *options) {
		if bytes >= 0 {
			o.leaseBytes = bytes
		}
	}
}

// WithLeaseHolder names the store's quota leases: lane n's are held as
// name/n. Give it the instance's id, so that a restarted instance takes up
// the leases it held. Without it, each Open draws a name of its own; the
// leases of a name no store holds any more are reclaimed when their
// project nears its limit.
func WithLeaseHolder(name string) Option {
	return func(o *options) { o.leaseHolder = name }
}

// WithRegisterer registers the store's group-commit metrics
// (marconi_store_batch_size, marconi_store_batch_reruns_total), its bus
// key's (marconi_bus_key_version, marconi_bus_key_opened_total) and its
// buses' dedicated connections' (marconi_pg_listener_connects_total,
// marconi_liveness_connects_total) with reg;
// without it they are kept but exported nowhere.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *options) { o.registerer = reg }
}

// WithConnectTimeout sets how long establishing one connection may take
// (default DefaultConnectTimeout). It overrides connect_timeout in the URL.
func WithConnectTimeout(d time.Duration) Option {
	return func(o *options) { o.connectTimeout = d }
}

// WithQueryTimeout sets the deadline each call gets when its context has no
// earlier one (default DefaultQueryTimeout); 0 means none.
func WithQueryTimeout(d time.Duration) Option {
	return func(o *options) { o.queryTimeout = d }
}

// WithMaxConns sets the size of the connection pool (default: pgxpool's,
// or pool_max_conns in the URL).
func WithMaxConns(n int32) Option {
	return func(o *options) { o.maxConns = n }
}

// WithPruneBatch sets how many rows one statement of Prune deletes at most
// (default DefaultPruneBatch); values below 1 keep the default.
func WithPruneBatch(n int) Option {
	return func(o *options) { o.pruneBatch = n }
}

// Store is the Postgres sessionstore.Store. It is safe for concurrent use.
type Store struct {
	pool         *pgxpool.Pool
	queryTimeout time.Duration
	pruneBatch   int
	maxBatch     int        // of a group commit, and of a Bus's NOTIFY statement
	group        *committer // nil when group commit is off
	closed       atomic.Bool
	metrics      *batchMetrics
	witness      *witness        // every connection's tracer: Witness reads it
	busKeys      *keyring        // the bus key, as this store's buses know it
	connects     connectCounters // its buses' dedicated connections'
	hist         *history        // the server histories its connections found (history.go)
	lease        leases          // how the batch lanes lease quota (append.go)
	ackedPayload int64           // the largest payload an ack keeps (WithAckedPayloadBytes)
	// setFrom is the fewest appends of a batch appendSetSQL stores
	// (defaultSetFrom; statementPerAppend with WithStatementPerAppend; the
	// tests' 1 sends every append through it): one append alone costs no
	// less by it, and a refusal costs it a second transaction.
	setFrom int
}

// leases is how a store's batch lanes lease pending-bytes room.
type leases struct {
	bytes   int64    // a lease's size; 0: leases off
	holders []string // lane n's holder name
}

// holder is the name lane's leases are held under.
func (l leases) holder(lane int) string { return l.holders[lane] }

// plannerParams are the planner settings of the store's connections.
// Every statement the store runs finds its rows through an index (by
// session, by seq, by key), but Postgres plans a prepared statement
// generically after its fifth run from the table statistics of that
// moment: taken while a table held a few rows of one or two sessions
// (autovacuum's first ANALYZE on a new deployment, or any VACUUM), they
// say that a session's rows are most of the table, and the plan it keeps
// for the connection's life scans the whole signals table for each ack
// (seen: a durable load falling to a quarter of its sends/s as the table
// grew). enable_seqscan off keeps every plan on its index while one
// exists; a full listing (the operator's) still scans when it must, and
// then costs what the planner adds to a disabled path (10^10), which is
// past every JIT threshold: jit off, or a one-row listing spends 230 ms
// compiling itself (seen). No statement of the store is one JIT speeds up.
var plannerParams = []struct{ name, value string }{{"enable_seqscan", "off"}, {"jit", "off"}}

// plannerSettings are the expressions that apply plannerParams on a new
// connection, but for those the database URL set itself (its
// ?enable_seqscan=on wins). They are set once connected rather than sent at
// startup, where a pooler in front (PgBouncer) refuses parameters it does
// not know.
func plannerSettings(params map[string]string) []string {
	var sets []string
	for _, p := range plannerParams {
		if _, set := params[p.name]; !set {
			sets = append(sets, fmt.Sprintf("set_config('%s', '%s', false)", p.name, p.value))
		}
	}
	return sets
}

// afterConnect is what a new connection of the store runs, params being
// its runtime parameters: one statement that reads the server's history
// for hist and applies plannerSettings, in one round trip (the simple
// protocol: no prepare).
func afterConnect(params map[string]string, hist *history) func(context.Context, *pgx.Conn) error {
	cols := append([]string{historySQL}, plannerSettings(params)...)
	q := "SELECT " + strings.Join(cols, ", ")
	return func(ctx context.Context, c *pgx.Conn) error {
		var id *string
		dst := make([]any, len(cols)) // nil: the settings' results are not kept
		dst[0] = &id
		if err := c.QueryRow(ctx, q, pgx.QueryExecModeSimpleProtocol).Scan(dst...); err != nil {
			return err
		}
		hist.saw(id)
		return nil
	}
}

// Open returns a Store on the database at databaseURL (postgres://..., or
// keyword/value: host=... dbname=..., as pgxpool.ParseConfig reads it). It
// does not connect: a hub can start while Postgres is down, answer
// ErrUnavailable, and recover by itself when Postgres comes back. Open fails
// only on a malformed URL.
func Open(ctx context.Context, databaseURL string, opts ...Option) (*Store, error) {
	o := options{connectTimeout: DefaultConnectTimeout, queryTimeout: DefaultQueryTimeout, leaseBytes: DefaultQuotaLeaseBytes, acksPerBatch: DefaultAcksPerBatch,
		ackedPayload: DefaultAckedPayloadBytes}
	for _, opt := range opts {
		opt(&o)
	}
	if o.pruneBatch < 1 {
		o.pruneBatch = DefaultPruneBatch
	}
	if o.maxBatch < 1 {
		o.maxBatch = DefaultMaxBatch
	}
	if o.inFlight < 1 {
		o.inFlight = DefaultBatchesInFlight
	}
	if o.leaseHolder == "" {
		o.leaseHolder = "store-" + rand.Text()[:12]
	}
	holders := make([]string, o.inFlight)
	for i := range holders {
		holders[i] = o.leaseHolder + "/" + strconv.Itoa(i)
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("pgstore: malformed database URL: %w", err)
	}
	metrics := newBatchMetrics()
	if err := metrics.register(o.registerer); err != nil {
		return nil, fmt.Errorf("pgstore: register metrics: %w", err)
	}
	keyMetrics := newBusKeyMetrics()
	if err := keyMetrics.register(o.registerer); err != nil {
		return nil, fmt.Errorf("pgstore: register metrics: %w", err)
	}
	connects := newConnectCounters()
	if err := registerAll(o.registerer, connects.listener, connects.liveness); err != nil {
		return nil, fmt.Errorf("pgstore: register metrics: %w", err)
	}
	if o.connectTimeout > 0 {
		cfg.ConnConfig.ConnectTimeout = o.connectTimeout
	}
	if o.maxConns > 0 {
		cfg.MaxConns = o.maxConns
	}
	hist := newHistory()
	if err := registerAll(o.registerer, hist.changes); err != nil {
		return nil, fmt.Errorf("pgstore: register metrics: %w", err)
	}
	cfg.AfterConnect = afterConnect(cfg.ConnConfig.RuntimeParams, hist)
	cfg.MinConns = 0 // never connect in the background at Open
	w := &witness{}
	cfg.ConnConfig.Tracer = w
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: open pool: %w", err)
	}
	s := &Store{pool: pool, queryTimeout: o.queryTimeout, pruneBatch: o.pruneBatch, maxBatch: o.maxBatch, metrics: metrics, witness: w,
		busKeys: newKeyring(o.busKey, keyMetrics), connects: connects, hist: hist,
		lease: leases{bytes: o.leaseBytes, holders: holders}, ackedPayload: int64(o.ackedPayload), setFrom: defaultSetFrom}
	if o.eachAppend {
		s.setFrom = statementPerAppend
	}
	if !o.groupCommitOff {
		s.group = newCommitter(o.maxBatch, 8*o.maxBatch, o.inFlight, s.runBatch)
		s.group.maxAcks = o.acksPerBatch
	}
	return s, nil
}

// call prepares a call: ErrUnavailable once closed, and the query timeout.
func (s *Store) call(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if s.closed.Load() {
		return ctx, func() {}, fmt.Errorf("store closed: %w", sessionstore.ErrUnavailable)
	}
	if s.queryTimeout <= 0 {
		return ctx, func() {}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.queryTimeout)
	return ctx, cancel, nil
}

// inTx runs fn in a transaction, committed when fn returns nil.
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Ping implements sessionstore.Store. A server that answers but is
// read-only (a standby) fails it with ErrUnavailable: it cannot serve.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return wrap("ping", err)
	}
	return wrap("ping", writable(ctx, s.pool))
}

// Close implements sessionstore.Store. Later calls return ErrUnavailable;
// Close may be called more than once.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.busKeys.stop()
	s.pool.Close()
	return nil
}

// --- sessions ---

const sessionCols = `tenant_id, project_id, session_id, surface, runtime_mode, runtime_mode_source,
	client_id, token_hash, registered_at, last_seen_at, last_verb_at, expires_at,
	assigned_instance, queue_instance, queue_attached_at, queue_detached_at, registration_key_hash,
	registration_api_key_hash`

func scanSession(row pgx.Row) (sessionstore.Session, error) {
	var (
		s                              sessionstore.Session
		seen, verb, attached, detached *time.Time
		registered, expires            time.Time
	)
	err := row.Scan(&s.TenantID, &s.ProjectID, &s.SessionID, &s.Surface, &s.RuntimeMode, &s.RuntimeModeSource,
		&s.ClientID, &s.TokenHash, &registered, &seen, &verb, &expires,
		&s.AssignedInstance, &s.QueueInstance, &attached, &detached, &s.RegistrationKeyHash, &s.RegistrationAPIKeyHash)
	if err != nil {
		return sessionstore.Session{}, err
	}
	s.RegisteredAt, s.ExpiresAt = registered.UTC(), expires.UTC()
	s.LastSeenAt, s.LastVerbAt = fromNull(seen), fromNull(verb)
	s.QueueAttachedAt, s.QueueDetachedAt = fromNull(attached), fromNull(detached)
	return s, nil
}

// CreateSession implements sessionstore.Store.
func (s *Store) CreateSession(ctx context.Context, in sessionstore.Session, now time.Time) (sessionstore.Session, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return sessionstore.Session{}, wrap("create session", err)
	}
	var out sessionstore.Session
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		// An expired row with the key goes first, its signals with it
		// (sessions' delete trigger, migration 0012), and with them their
		// idempotency keys.
		if _, err := deleteSession(ctx, tx, in.Key, now); err != nil {
			return err
		}
		var err error
		out, err = scanSession(tx.QueryRow(ctx, `INSERT INTO sessions (
				tenant_id, project_id, session_id, surface, runtime_mode, runtime_mode_source,
				client_id, token_hash, registered_at, last_seen_at, last_verb_at, expires_at,
				assigned_instance, queue_instance, queue_attached_at, queue_detached_at, queue_latest_attach,
				registration_key_hash, registration_api_key_hash)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $15, $17, $18)
			RETURNING `+sessionCols,
			in.TenantID, in.ProjectID, in.SessionID, in.Surface, in.RuntimeMode, in.RuntimeModeSource,
			in.ClientID, in.TokenHash, in.RegisteredAt, toNull(in.LastSeenAt), toNull(in.LastVerbAt), in.ExpiresAt,
			in.AssignedInstance, in.QueueInstance, toNull(in.QueueAttachedAt), toNull(in.QueueDetachedAt),
			in.RegistrationKeyHash, in.RegistrationAPIKeyHash))
		return err
	})
	if err != nil {
		return sessionstore.Session{}, wrap("create session", err)
	}
	return out, nil
}

// ResumeSession implements sessionstore.Store.
func (s *Store) ResumeSession(ctx context.Context, k sessionstore.Key, oldHash, newHash []byte, t sessionstore.Touch, now time.Time) (sessionstore.Session, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return sessionstore.Session{}, wrap("resume session", err)
	}
	var out sessionstore.Session
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var current []byte
		if err := tx.QueryRow(ctx, `SELECT token_hash FROM sessions
			WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND expires_at >= $4
			FOR UPDATE`, k.TenantID, k.ProjectID, k.SessionID, now).Scan(&current); err != nil {
			return err
		}
		if string(current) != string(oldHash) {
			return sessionstore.ErrTokenMismatch
		}
		var err error
		out, err = scanSession(tx.QueryRow(ctx, `UPDATE sessions SET
				token_hash   = $4,
				last_seen_at = GREATEST(last_seen_at, $5::timestamptz),
				last_verb_at = GREATEST(last_verb_at, $6::timestamptz),
				expires_at   = GREATEST(expires_at, $7::timestamptz),
				registration_key_hash = NULL, -- the token is the resume's now
				registration_api_key_hash = NULL
			WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3
			RETURNING `+sessionCols,
			k.TenantID, k.ProjectID, k.SessionID, newHash, toNull(t.SeenAt), toNull(t.VerbAt), toNull(t.ExpiresAt)))
		return err
	})
	if err != nil {
		return sessionstore.Session{}, wrap("resume session", err)
	}
	return out, nil
}

// RetryRegistration implements sessionstore.Store. One statement: a
// registration tries it before creating, so a miss must cost one lookup.
func (s *Store) RetryRegistration(ctx context.Context, k sessionstore.Key, keyHash, apiKeyHash []byte, since time.Time, newHash []byte, t sessionstore.Touch, now time.Time) (sessionstore.Session, error) {
	if len(keyHash) == 0 || len(apiKeyHash) == 0 {
		return sessionstore.Session{}, fmt.Errorf("pgstore: retry registration without a key: %w", sessionstore.ErrNotFound)
	}
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return sessionstore.Session{}, wrap("retry registration", err)
	}
	out, err := scanSession(s.pool.QueryRow(ctx, `UPDATE sessions SET
			token_hash   = $4,
			last_seen_at = GREATEST(last_seen_at, $5::timestamptz),
			last_verb_at = GREATEST(last_verb_at, $6::timestamptz),
			expires_at   = GREATEST(expires_at, $7::timestamptz)
		WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND expires_at >= $8
			AND registration_key_hash = $9 AND registration_api_key_hash = $11 AND registered_at >= $10
		RETURNING `+sessionCols,
		k.TenantID, k.ProjectID, k.SessionID, newHash, toNull(t.SeenAt), toNull(t.VerbAt), toNull(t.ExpiresAt),
		now, keyHash, since, apiKeyHash))
	if err != nil {
		return sessionstore.Session{}, wrap("retry registration", err)
	}
	return out, nil
}

// SpendRegistrationKey implements sessionstore.Store.
func (s *Store) SpendRegistrationKey(ctx context.Context, k sessionstore.Key, tokenHash []byte) error {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return wrap("spend registration key", err)
	}
	_, err = s.pool.Exec(ctx, `UPDATE sessions SET registration_key_hash = NULL, registration_api_key_hash = NULL
		WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND token_hash = $4
			AND registration_key_hash IS NOT NULL`,
		k.TenantID, k.ProjectID, k.SessionID, tokenHash)
	return wrap("spend registration key", err)
}

// SessionByToken implements sessionstore.Store.
func (s *Store) SessionByToken(ctx context.Context, h []byte, now time.Time) (sessionstore.Session, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return sessionstore.Session{}, wrap("session by token", err)
	}
	out, err := scanSession(s.pool.QueryRow(ctx, `SELECT `+sessionCols+` FROM sessions
		WHERE token_hash = $1 AND expires_at >= $2`, h, now))
	if err != nil {
		return sessionstore.Session{}, wrap("session by token", err)
	}
	return out, nil
}

// GetSession implements sessionstore.Store.
func (s *Store) GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return sessionstore.Session{}, wrap("get session", err)
	}
	out, err := scanSession(s.pool.QueryRow(ctx, `SELECT `+sessionCols+` FROM sessions
		WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND expires_at >= $4`,
		k.TenantID, k.ProjectID, k.SessionID, now))
	if err != nil {
		return sessionstore.Session{}, wrap("get session", err)
	}
	return out, nil
}

// ListSessions implements sessionstore.Store. A limit of 0 or less means no
// limit.
func (s *Store) ListSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) ([]sessionstore.Session, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return nil, wrap("list sessions", err)
	}
	where, args := liveSessionsWhere(f, now)
	args = append(args, limitOrNil(f.Limit))
	rows, err := s.pool.Query(ctx, `SELECT `+sessionCols+` FROM sessions WHERE `+where+`
		ORDER BY tenant_id COLLATE "C", project_id COLLATE "C", session_id COLLATE "C"
		LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return nil, wrap("list sessions", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sessionstore.Session, error) { return scanSession(r) })
	if err != nil {
		return nil, wrap("list sessions", err)
	}
	return out, nil
}

// liveSessionsWhere is the WHERE clause of the sessions live at now that
// match f's tenant and project, and its arguments ($1 is now). Only the
// filters given become conditions: with "$2 = ” OR tenant_id = $2" the
// generic plan Postgres settles on after a few executions cannot use the
// primary key and scans every session.
func liveSessionsWhere(f sessionstore.SessionFilter, now time.Time) (string, []any) {
	where, args := "expires_at >= $1", []any{now}
	if f.TenantID != "" {
		args = append(args, f.TenantID)
		where += " AND tenant_id = $" + strconv.Itoa(len(args))
	}
	if f.ProjectID != "" {
		args = append(args, f.ProjectID)
		where += " AND project_id = $" + strconv.Itoa(len(args))
	}
	return where, args
}

// CountSessions implements sessionstore.Store: a scan of the primary key's
// (tenant_id, project_id) prefix, stopped at the limit.
func (s *Store) CountSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) (int, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, wrap("count sessions", err)
	}
	where, args := liveSessionsWhere(f, now)
	args = append(args, limitOrNil(f.Limit))
	var n int
	err = s.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM sessions WHERE `+where+`
		LIMIT $`+strconv.Itoa(len(args))+`) AS live`, args...).Scan(&n)
	if err != nil {
		return 0, wrap("count sessions", err)
	}
	return n, nil
}

// CountByClient implements sessionstore.Store: one grouped scan of the live
// sessions of one source.
func (s *Store) CountByClient(ctx context.Context, now time.Time, source marconi.ModeSource) (map[string]map[marconi.RuntimeMode]int, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return nil, wrap("count by client", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT client_id, runtime_mode, count(*)
		FROM sessions WHERE expires_at >= $1 AND runtime_mode_source = $2 GROUP BY 1, 2`, now, source)
	if err != nil {
		return nil, wrap("count by client", err)
	}
	out := map[string]map[marconi.RuntimeMode]int{}
	var (
		client string
		mode   marconi.RuntimeMode
		n      int
	)
	_, err = pgx.ForEachRow(rows, []any{&client, &mode, &n}, func() error {
		if out[client] == nil {
			out[client] = map[marconi.RuntimeMode]int{}
		}
		out[client][mode] += n
		return nil
	})
	if err != nil {
		return nil, wrap("count by client", err)
	}
	return out, nil
}

// SessionStats implements sessionstore.Store: one grouped scan of the live
// sessions, folded into the maps here (the groups are few: modes × sources ×
// instances²).
func (s *Store) SessionStats(ctx context.Context, now time.Time) (sessionstore.SessionStats, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return sessionstore.SessionStats{}, wrap("session stats", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT runtime_mode, runtime_mode_source, assigned_instance, queue_instance, count(*)
		FROM sessions WHERE expires_at >= $1 GROUP BY 1, 2, 3, 4`, now)
	if err != nil {
		return sessionstore.SessionStats{}, wrap("session stats", err)
	}
	out := sessionstore.SessionStats{
		ByMode: map[marconi.RuntimeMode]int{}, BySource: map[marconi.ModeSource]int{},
		ByAssignedInstance: map[string]int{}, ByQueueInstance: map[string]int{},
	}
	var (
		mode            marconi.RuntimeMode
		source          marconi.ModeSource
		assigned, queue string
		n               int
	)
	_, err = pgx.ForEachRow(rows, []any{&mode, &source, &assigned, &queue, &n}, func() error {
		out.Total += n
		out.ByMode[mode] += n
		out.BySource[source] += n
		if assigned != "" {
			out.ByAssignedInstance[assigned] += n
		}
		if queue != "" {
			out.ByQueueInstance[queue] += n
		}
		return nil
	})
	if err != nil {
		return sessionstore.SessionStats{}, wrap("session stats", err)
	}
	return out, nil
}

// TouchSession implements sessionstore.Store. With group commit on (the
// default) it joins the next batch (rows.go): heartbeats then share commits.
func (s *Store) TouchSession(ctx context.Context, k sessionstore.Key, t sessionstore.Touch, now time.Time) error {
	return wrap("touch session", s.writeRow(ctx, &rowReq{k: k, touch: t, live: now}))
}

// TouchSessionAs implements sessionstore.Store: TouchSession whose
// statement (sessionRowsSQL) matches the row only while h holds it.
func (s *Store) TouchSessionAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, t sessionstore.Touch, now time.Time) error {
	return wrap("touch session", s.writeRow(ctx, &rowReq{k: k, touch: t, live: now, as: &h}))
}

// deleteSessionSQL deletes a session (its signals go with it: the delete
// trigger of sessions, migration 0012)
// and takes its pending bytes off its project's by a delta; it returns how
// many sessions it deleted. $4 false deletes the session whatever its
// expiry; true only when it expired before $5.
const deleteSessionSQL = `WITH d AS (
	DELETE FROM sessions WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3
	  AND (NOT $4::bool OR expires_at < $5::timestamptz)
	RETURNING pending_bytes
), u AS (
	INSERT INTO project_usage_deltas (tenant_id, project_id, delta)
	SELECT $1, $2, -pending_bytes FROM d WHERE pending_bytes <> 0
)
SELECT count(*) FROM d`

// deleteSession runs deleteSessionSQL on db (the pool or a transaction).
func deleteSession(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, k sessionstore.Key, onlyExpiredBefore time.Time) (int, error) {
	var n int
	err := db.QueryRow(ctx, deleteSessionSQL, k.TenantID, k.ProjectID, k.SessionID,
		!onlyExpiredBefore.IsZero(), toNull(onlyExpiredBefore)).Scan(&n)
	return n, err
}

// DeleteSession implements sessionstore.Store.
func (s *Store) DeleteSession(ctx context.Context, k sessionstore.Key) error {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return wrap("delete session", err)
	}
	n, err := deleteSession(ctx, s.pool, k, time.Time{})
	return wrap("delete session", affected(int64(n), err))
}

// SetQueue implements sessionstore.Store: queueCAS in the next batch
// (rows.go).
func (s *Store) SetQueue(ctx context.Context, k sessionstore.Key, instance string, at time.Time) error {
	return wrap("set queue", s.writeRow(ctx, &rowReq{k: k, queue: &queuePlacement{instance: instance, at: at}}))
}

// AttachQueue implements sessionstore.Store: SetQueue's compare-and-set and
// the touch in one statement of the next batch (rows.go), which also
// returns the pending count (last_seq - acked_seq: acks are cumulative and
// seqs gap-free, so it is CountPending's count without its read).
func (s *Store) AttachQueue(ctx context.Context, k sessionstore.Key, instance string, at time.Time, t sessionstore.Touch, now time.Time) (int, error) {
	r := &appendReq{row: &rowReq{k: k, touch: t, live: now, queue: &queuePlacement{instance: instance, at: at}}}
	if err := s.commit(ctx, r); err != nil {
		return 0, wrap("attach queue", err)
	}
	return r.out.pending, nil
}

// ClearQueue implements sessionstore.Store: clearRowsSQL in the next batch
// (rows.go).
func (s *Store) ClearQueue(ctx context.Context, k sessionstore.Key, instance string, attachedAt, at time.Time) (bool, error) {
	r := &appendReq{row: &rowReq{k: k, clear: &queueClear{instance: instance, attachedAt: attachedAt, at: at}}}
	if err := s.commit(ctx, r); err != nil {
		return false, wrap("clear queue", err)
	}
	return r.out.cleared, nil
}

// AssignInstance implements sessionstore.Store.
func (s *Store) AssignInstance(ctx context.Context, k sessionstore.Key, instance string) error {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return wrap("assign instance", err)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE sessions SET assigned_instance = $4
		WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3`,
		k.TenantID, k.ProjectID, k.SessionID, instance)
	return wrap("assign instance", affected(tag.RowsAffected(), err))
}

// ReassignInstance implements sessionstore.Store. The UPDATE's WHERE on
// assigned_instance is the compare: under READ COMMITTED a racing UPDATE
// waits for the row lock and then re-checks the condition on the row the
// winner wrote, so it moves nothing.
func (s *Store) ReassignInstance(ctx context.Context, k sessionstore.Key, from, to string) (bool, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return false, wrap("reassign instance", err)
	}
	var moved, exists bool
	err = s.pool.QueryRow(ctx, `WITH moved AS (
			UPDATE sessions SET assigned_instance = $5
			WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3
			  AND assigned_instance = $4
			RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM moved),
		       EXISTS (SELECT 1 FROM sessions
		               WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3)`,
		k.TenantID, k.ProjectID, k.SessionID, from, to).Scan(&moved, &exists)
	if err != nil {
		return false, wrap("reassign instance", err)
	}
	if !exists {
		return false, wrap("reassign instance", sessionstore.ErrNotFound)
	}
	return moved, nil
}

// --- API keys ---

// PutAPIKey implements sessionstore.Store.
func (s *Store) PutAPIKey(ctx context.Context, k sessionstore.APIKey) error {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return wrap("put api key", err)
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO api_keys (hash, tenant_id, project_id, created_at)
		VALUES ($1, $2, $3, $4)`, k.Hash, k.TenantID, k.ProjectID, k.CreatedAt)
	return wrap("put api key", err)
}

// APIKeyByHash implements sessionstore.Store.
func (s *Store) APIKeyByHash(ctx context.Context, h []byte) (sessionstore.APIKey, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return sessionstore.APIKey{}, wrap("api key by hash", err)
	}
	var k sessionstore.APIKey
	err = s.pool.QueryRow(ctx, `SELECT hash, tenant_id, project_id, created_at FROM api_keys WHERE hash = $1`, h).
		Scan(&k.Hash, &k.TenantID, &k.ProjectID, &k.CreatedAt)
	if err != nil {
		return sessionstore.APIKey{}, wrap("api key by hash", err)
	}
	k.CreatedAt = k.CreatedAt.UTC()
	return k, nil
}

// DeleteAPIKey implements sessionstore.Store.
func (s *Store) DeleteAPIKey(ctx context.Context, h []byte) (sessionstore.APIKey, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return sessionstore.APIKey{}, wrap("delete api key", err)
	}
	var k sessionstore.APIKey
	err = s.pool.QueryRow(ctx, `DELETE FROM api_keys WHERE hash = $1 RETURNING hash, tenant_id, project_id, created_at`, h).
		Scan(&k.Hash, &k.TenantID, &k.ProjectID, &k.CreatedAt)
	if err != nil {
		return sessionstore.APIKey{}, wrap("delete api key", err)
	}
	k.CreatedAt = k.CreatedAt.UTC()
	return k, nil
}

// --- instances, fallbacks, counters ---

// HeartbeatInstance implements sessionstore.Store.
func (s *Store) HeartbeatInstance(ctx context.Context, in sessionstore.Instance) error {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return wrap("heartbeat instance", err)
	}
	// An unknown version (0) is NULL, as an older release's heartbeat,
	// which does not name the column, leaves it on a new row.
	_, err = s.pool.Exec(ctx, `INSERT INTO instances (id, url, draining, started_at, last_heartbeat_at, bus_key_version)
		VALUES ($1, $2, $3, $4, $5, nullif($6::bigint, 0))
		ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, draining = EXCLUDED.draining,
			started_at = EXCLUDED.started_at, last_heartbeat_at = EXCLUDED.last_heartbeat_at,
			bus_key_version = EXCLUDED.bus_key_version`,
		in.ID, in.URL, in.Draining, in.StartedAt, in.LastHeartbeatAt, in.BusKeyVersion)
	return wrap("heartbeat instance", err)
}

// ListInstances implements sessionstore.Store.
func (s *Store) ListInstances(ctx context.Context) ([]sessionstore.Instance, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return nil, wrap("list instances", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT id, url, draining, started_at, last_heartbeat_at, coalesce(bus_key_version, 0)
		FROM instances ORDER BY id COLLATE "C"`)
	if err != nil {
		return nil, wrap("list instances", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sessionstore.Instance, error) {
		var in sessionstore.Instance
		err := r.Scan(&in.ID, &in.URL, &in.Draining, &in.StartedAt, &in.LastHeartbeatAt, &in.BusKeyVersion)
		in.StartedAt, in.LastHeartbeatAt = in.StartedAt.UTC(), in.LastHeartbeatAt.UTC()
		return in, err
	})
	if err != nil {
		return nil, wrap("list instances", err)
	}
	return out, nil
}

// RecordFallback implements sessionstore.Store: the event and its counter
// are written in one transaction.
func (s *Store) RecordFallback(ctx context.Context, e sessionstore.FallbackEvent) error {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return wrap("record fallback", err)
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO fallback_events (tenant_id, project_id, session_id,
				from_instance, to_instance, runtime_mode, runtime_mode_source, reason, at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			e.TenantID, e.ProjectID, e.SessionID, e.FromInstance, e.ToInstance,
			e.RuntimeMode, e.RuntimeModeSource, e.Reason, e.At); err != nil {
			return err
		}
		return addCount(ctx, tx, cmp.Or(e.Counter, sessionstore.CounterFallbacks), 1)
	})
	return wrap("record fallback", err)
}

// ListFallbacks implements sessionstore.Store: newest At first, the later
// recorded first among equal times. A limit of 0 or less means no limit.
func (s *Store) ListFallbacks(ctx context.Context, limit int) ([]sessionstore.FallbackEvent, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return nil, wrap("list fallbacks", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT tenant_id, project_id, session_id, from_instance, to_instance,
			runtime_mode, runtime_mode_source, reason, at
		FROM fallback_events ORDER BY at DESC, id DESC LIMIT $1`, limitOrNil(limit))
	if err != nil {
		return nil, wrap("list fallbacks", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sessionstore.FallbackEvent, error) {
		var e sessionstore.FallbackEvent
		err := r.Scan(&e.TenantID, &e.ProjectID, &e.SessionID, &e.FromInstance, &e.ToInstance,
			&e.RuntimeMode, &e.RuntimeModeSource, &e.Reason, &e.At)
		e.At = e.At.UTC()
		return e, err
	})
	if err != nil {
		return nil, wrap("list fallbacks", err)
	}
	return out, nil
}

// AddCount implements sessionstore.Store. An unknown counter is an error.
func (s *Store) AddCount(ctx context.Context, c sessionstore.Counter, n int64) error {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return wrap("add count", err)
	}
	return wrap("add count", addCount(ctx, s.pool, c, n))
}

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func addCount(ctx context.Context, db execer, c sessionstore.Counter, n int64) error {
	switch c {
	case sessionstore.CounterFallbacks, sessionstore.CounterReassignments,
		sessionstore.CounterAdaptivePlacements, sessionstore.CounterAdaptivePlacementMismatches:
	default:
		return fmt.Errorf("unknown counter %q", c)
	}
	_, err := db.Exec(ctx, `INSERT INTO counters (name, value) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET value = counters.value + EXCLUDED.value`, string(c), n)
	return err
}

// Counts implements sessionstore.Store.
func (s *Store) Counts(ctx context.Context) (sessionstore.Counts, error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return sessionstore.Counts{}, wrap("counts", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT name, value FROM counters`)
	if err != nil {
		return sessionstore.Counts{}, wrap("counts", err)
	}
	var out sessionstore.Counts
	var (
		name  string
		value int64
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &value}, func() error {
		switch sessionstore.Counter(name) {
		case sessionstore.CounterFallbacks:
			out.Fallbacks = value
		case sessionstore.CounterReassignments:
			out.Reassignments = value
		case sessionstore.CounterAdaptivePlacements:
			out.AdaptivePlacements = value
		case sessionstore.CounterAdaptivePlacementMismatches:
			out.AdaptivePlacementMismatches = value
		}
		return nil
	})
	if err != nil {
		return sessionstore.Counts{}, wrap("counts", err)
	}
	return out, nil
}

// --- helpers ---

// toNull maps the zero time to SQL NULL.
func toNull(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// fromNull maps SQL NULL to the zero time, and any time to UTC.
func fromNull(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// limitOrNil maps a limit of 0 or less to SQL NULL: LIMIT NULL is no limit.
func limitOrNil(n int) *int64 {
	if n <= 0 {
		return nil
	}
	v := int64(n)
	return &v
}

// affected maps an update or delete that touched no row to ErrNotFound.
func affected(n int64, err error) error {
	if err != nil {
		return err
	}
	if n == 0 {
		return sessionstore.ErrNotFound
	}
	return nil
}
