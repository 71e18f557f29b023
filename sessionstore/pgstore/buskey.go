package pgstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The bus key (migrations 0008 and 0013) seals the signals that wake-ups
// carry between instances. RotateBusKey replaces it on a live fleet: the
// row keeps the key before, and each instance re-reads the row on its own
// (busKeys), seals with the newest key it knows and opens with that one
// or, for a while after a rotation, the one before. docs/security.md, "The
// bus key", says what this bounds.

// Defaults of BusKeyTimings.
const (
	// DefaultBusKeyRefresh is how often an instance re-reads the bus key.
	DefaultBusKeyRefresh = 30 * time.Second
	// DefaultBusKeyGrace is how long after a rotation the previous key
	// still opens a carried signal.
	DefaultBusKeyGrace = 120 * time.Second
	// DefaultBusKeyRecheck is how soon after one re-read forced by a
	// carried signal that no known key opens another may be.
	DefaultBusKeyRecheck = time.Second
)

// busKeySize is the size of a key RotateBusKey makes: HMAC-SHA256's block
// is 64 bytes, its output 32; 32 random bytes give the MAC its full strength.
const busKeySize = 32

// BusKeyTimings are when an instance reads the bus key again. Zero fields
// take their defaults.
type BusKeyTimings struct {
	// Refresh: the key is re-read at least this often, so an instance seals
	// with a rotated key within about this long (the listener's timer
	// keeps that true of an idle instance too).
	Refresh time.Duration
	// Grace: how long after a rotation, on the database's clock, the
	// previous key still opens. It must be longer than Refresh, or a
	// wake-up sealed by an instance that has not yet re-read is dropped
	// (to the store) by one that has.
	Grace time.Duration
	// Recheck bounds the re-reads that a carried signal no known key opens
	// forces (one per Recheck), since anyone who can NOTIFY can send one.
	Recheck time.Duration
}

func (t BusKeyTimings) withDefaults() BusKeyTimings {
	if t.Refresh <= 0 {
		t.Refresh = DefaultBusKeyRefresh
	}
	if t.Grace <= 0 {
		t.Grace = DefaultBusKeyGrace
	}
	if t.Recheck <= 0 {
		t.Recheck = DefaultBusKeyRecheck
	}
	return t
}

// WithBusKeyTimings sets when the store's buses read the bus key again
// (BusKeyTimings; defaults DefaultBusKeyRefresh, DefaultBusKeyGrace and
// DefaultBusKeyRecheck).
func WithBusKeyTimings(t BusKeyTimings) Option {
	return func(o *options) { o.busKey = t }
}

// busKeys are the keys an instance knows: current seals and opens,
// previous (nil when there is none, or its grace is over) only opens.
type busKeys struct {
	version           int64
	current, previous []byte
}

// codec is the wake-up codec of these keys.
func (k busKeys) codec() wakeCodec { return wakeCodec{key: k.current, prev: k.previous} }

// keyring is a store's copy of the bus key row, read lazily and again every
// Refresh. It is safe for concurrent use.
type keyring struct {
	t       BusKeyTimings
	now     func() time.Time
	metrics *busKeyMetrics

	// fetch reads the row (fetchKeyRow; a test's may hang).
	fetch func(ctx context.Context, s *Store) (keyRow, error)

	mu            sync.Mutex
	keys          busKeys
	previousUntil time.Time // local time the previous key stops opening
	readAt        time.Time // last read that succeeded
	failedAt      time.Time // last read that failed
	recheckAt     time.Time // last read a miss forced
	reading       bool      // a background read is under way (readSoon)
	stopped       bool      // the store is closing: no background read starts
	readers       sync.WaitGroup
}

func newKeyring(t BusKeyTimings, m *busKeyMetrics) *keyring {
	return &keyring{t: t.withDefaults(), now: time.Now, metrics: m, fetch: fetchKeyRow}
}

// fetchKeyRow reads the bus key row.
func fetchKeyRow(ctx context.Context, s *Store) (row keyRow, err error) {
	err = s.pool.QueryRow(ctx, keySQL).Scan(&row.key, &row.previous, &row.version, &row.age)
	return row, err
}

// keySQL reads the bus key row, with how long ago (on the database's clock)
// it was rotated, so that no clock skew between hosts moves the grace.
const keySQL = `SELECT key, previous, version, extract(epoch FROM now() - rotated_at)::float8 FROM bus_key WHERE id = 1`

// rotateSQL makes $1 the bus key and the current one the previous.
const rotateSQL = `UPDATE bus_key SET previous = key, key = $1, version = version + 1, rotated_at = now()
	WHERE id = 1 RETURNING key, previous, version, 0::float8, rotated_at`

// keyRow is the bus key row as keySQL and rotateSQL read it.
type keyRow struct {
	key, previous []byte
	version       int64
	age           float64 // seconds since the rotation
}

// get returns the keys, reading the row when Refresh has passed since the
// last read (or a failed read keyRetry ago): nil keys until a first read
// succeeds; the keys known so far while the store cannot be read. Until
// the first read succeeds get reads itself; after it, a read that is due
// runs in the background (readSoon) and get returns the keys known, so a
// slow store holds up no wake-up and no publisher. A change of version is
// logged on log.
func (r *keyring) get(ctx context.Context, s *Store, log *slog.Logger) busKeys {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if (r.keys.current != nil && now.Sub(r.readAt) < r.t.Refresh) || now.Sub(r.failedAt) < keyRetry {
		return r.current(now)
	}
	if r.keys.current != nil {
		r.readSoon(s, log)
	} else {
		r.read(ctx, s, now, log)
	}
	return r.current(now)
}

// recheckSoon starts a read of the row on a goroutine of its own, at most
// once per Recheck and one at a time, after a carried signal that no known
// key opened: the sender may have a newer key. Nothing waits for it: the
// wake-up that forced it arrives bare (its signal is read from the store),
// and the wake-ups after it are opened with what the read finds once it
// is done, so a slow store holds up no wake-up.
func (r *keyring) recheckSoon(s *Store, log *slog.Logger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if r.reading || now.Sub(r.recheckAt) < r.t.Recheck {
		return
	}
	r.recheckAt = now
	r.readSoon(s, log)
}

// readSoon starts a read of the row on a goroutine of its own, unless one
// is under way or the store is closing; r.mu is held.
func (r *keyring) readSoon(s *Store, log *slog.Logger) {
	if r.stopped || r.reading {
		return
	}
	r.reading = true
	r.readers.Add(1)
	go func() {
		defer r.readers.Done()
		ctx, cancel := context.WithTimeout(context.Background(), keyReadTimeout)
		defer cancel()
		row, err := r.fetch(ctx, s)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.reading = false
		r.keep(row, err, log)
	}()
}

// keep records a read of the row that ran without r.mu and ended now; r.mu
// is held. A read that ended meanwhile with a newer version wins.
func (r *keyring) keep(row keyRow, err error, log *slog.Logger) {
	switch {
	case err != nil:
		r.failedAt = r.now()
		log.Debug("bus key not readable; wake-ups carry no signal until it is, or keep the keys read before", "err", err)
	case row.version >= r.keys.version:
		r.set(row, r.now(), log)
	}
}

// stop waits for a background read under way and starts none after it:
// the store is closing.
func (r *keyring) stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.readers.Wait()
}

// due is how long until get reads the row again: once Refresh has passed
// since the last read, and keyRetry since the last failed one; while a
// background read is under way, the bound on that read.
func (r *keyring) due() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reading {
		return keyReadTimeout
	}
	at := r.failedAt.Add(keyRetry)
	if r.keys.current != nil && r.readAt.Add(r.t.Refresh).After(at) {
		at = r.readAt.Add(r.t.Refresh)
	}
	return max(0, at.Sub(r.now()))
}

// current is the keys at now: the previous one dropped once its grace is over.
func (r *keyring) current(now time.Time) busKeys {
	k := r.keys
	if !now.Before(r.previousUntil) {
		k.previous = nil
	}
	return k
}

// read reads the row into the ring; r.mu is held.
func (r *keyring) read(ctx context.Context, s *Store, now time.Time, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, keyReadTimeout)
	defer cancel()
	row, err := r.fetch(ctx, s)
	if err != nil {
		r.failedAt = now
		log.Debug("bus key not readable; wake-ups carry no signal until it is, or keep the keys read before", "err", err)
		return
	}
	r.set(row, now, log)
}

// load reads the row now, whatever failed before, without holding r.mu
// meanwhile (a slow store holds up no wake-up), and returns the version
// known after it.
func (r *keyring) load(ctx context.Context, s *Store, log *slog.Logger) int64 {
	ctx, cancel := context.WithTimeout(ctx, keyReadTimeout)
	defer cancel()
	row, err := r.fetch(ctx, s)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keep(row, err, log)
	return r.keys.version
}

// set makes row the ring's keys, read at now; r.mu is held. A nil log
// logs nothing.
func (r *keyring) set(row keyRow, now time.Time, log *slog.Logger) {
	if row.version != r.keys.version && log != nil {
		// The operator's sign that this instance seals with the new key;
		// the key itself is never logged.
		log.Info("bus key in use", "version", row.version, "rotated_seconds_ago", int64(row.age))
	}
	r.keys = busKeys{version: row.version, current: row.key, previous: row.previous}
	r.previousUntil = now.Add(r.t.Grace - time.Duration(row.age*float64(time.Second)))
	r.readAt = now
	r.metrics.version.Set(float64(row.version))
}

// RotateBusKey makes a new bus key from crypto/rand, keeps the current one
// as the previous (which opens for BusKeyTimings.Grace more), and returns
// the new key's version (1 is the key migration 0008 made, each rotation
// adds one) and the database's time of the rotation. This store's buses
// seal with the new key at once; every other instance's within its
// BusKeyTimings.Refresh. Returns an error wrapping
// sessionstore.ErrUnavailable when Postgres cannot be reached.
func (s *Store) RotateBusKey(ctx context.Context) (version int64, rotatedAt time.Time, err error) {
	key := make([]byte, busKeySize)
	if _, err := rand.Read(key); err != nil {
		return 0, time.Time{}, fmt.Errorf("rotate bus key: crypto/rand: %w", err)
	}
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, time.Time{}, wrap("rotate bus key", err)
	}
	var row keyRow
	if err := s.pool.QueryRow(ctx, rotateSQL, key).Scan(&row.key, &row.previous, &row.version, &row.age, &rotatedAt); err != nil {
		return 0, time.Time{}, wrap("rotate bus key", err)
	}
	r := s.busKeys
	r.mu.Lock()
	r.set(row, r.now(), nil) // the caller logs the rotation
	r.mu.Unlock()
	return row.version, rotatedAt.UTC(), nil
}

// BusKey returns the version of the bus key the database holds now and when
// it became current. Returns an error wrapping sessionstore.ErrUnavailable
// when Postgres cannot be reached.
func (s *Store) BusKey(ctx context.Context) (version int64, rotatedAt time.Time, err error) {
	ctx, cancel, err := s.call(ctx)
	defer cancel()
	if err != nil {
		return 0, time.Time{}, wrap("bus key", err)
	}
	err = s.pool.QueryRow(ctx, `SELECT version, rotated_at FROM bus_key WHERE id = 1`).Scan(&version, &rotatedAt)
	return version, rotatedAt.UTC(), wrap("bus key", err)
}

// BusKeyInUse is the version of the bus key this store's buses seal with
// now (0 before it was first read).
func (s *Store) BusKeyInUse() int64 {
	s.busKeys.mu.Lock()
	defer s.busKeys.mu.Unlock()
	return s.busKeys.keys.version
}

// LoadBusKey is BusKeyInUse once the key was read; until then it reads the
// key at each call, whenever a read failed before, so that what an instance
// reports of its key from its first heartbeat on is the key, not "not read
// yet". It is 0 while the key cannot be read. A change of version is logged
// on log, as the buses log it.
func (s *Store) LoadBusKey(ctx context.Context, log *slog.Logger) int64 {
	if v := s.BusKeyInUse(); v != 0 {
		return v
	}
	return s.busKeys.load(ctx, s, log)
}

// BusKeyRefresh is how often this store reads the bus key again
// (BusKeyTimings.Refresh): the bound on picking a rotation up.
func (s *Store) BusKeyRefresh() time.Duration { return s.busKeys.t.Refresh }

// busKeyMetrics show each instance's bus key and what it opened.
type busKeyMetrics struct {
	version prometheus.Gauge
	opened  *prometheus.CounterVec
	// current, previous and none are opened's series.
	current, previous, none prometheus.Counter
}

// Results of opening a carried signal (the result label of
// marconi_bus_key_opened_total).
const (
	openedCurrent  = "current"  // under the key this instance seals with
	openedPrevious = "previous" // under the key before, within its grace
	openedNone     = "none"     // under no key known here: read from the store
)

func newBusKeyMetrics() *busKeyMetrics {
	m := &busKeyMetrics{
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "marconi_bus_key_version",
			Help: "Version of the bus key this instance seals carried signals with (0 until first read); after a rotation every instance shows the new version within MARCONI_BUS_KEY_REFRESH_SECONDS.",
		}),
		opened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marconi_bus_key_opened_total",
			Help: "Signals carried by wake-ups to this instance, by the bus key that opened them: current, previous (sealed before the sender re-read a rotation), or none (no key known here; the signal was read from the store).",
		}, []string{"result"}),
	}
	m.current = m.opened.WithLabelValues(openedCurrent)
	m.previous = m.opened.WithLabelValues(openedPrevious)
	m.none = m.opened.WithLabelValues(openedNone)
	return m
}

// register registers m with reg; nil registers nowhere.
func (m *busKeyMetrics) register(reg prometheus.Registerer) error {
	return registerAll(reg, m.version, m.opened)
}

// count adds what one payload's decode opened.
func (m *busKeyMetrics) count(t openTally) {
	for _, c := range [...]struct {
		n int
		c prometheus.Counter
	}{{t.current, m.current}, {t.previous, m.previous}, {t.missed, m.none}} {
		if c.n > 0 {
			c.c.Add(float64(c.n))
		}
	}
}
