package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// membersStore is what Members needs of the store.
type membersStore interface {
	HeartbeatInstance(ctx context.Context, in sessionstore.Instance) error
	ListInstances(ctx context.Context) ([]sessionstore.Instance, error)
}

// Members is the fabric's membership and liveness: it heartbeats this
// instance into the store and keeps a view of every instance's health, from
// their heartbeats and, with a prober, from their processes' connections. Its
// queries read the view and make no store call. It is safe for concurrent
// use.
type Members struct {
	cfg    Config
	store  membersStore
	prober Prober // nil: heartbeat only
	// busKeyVersion is Deps.BusKeyVersion: what each heartbeat writes.
	busKeyVersion func(context.Context) int64
	now           func() time.Time
	log           *slog.Logger
	startedAt     time.Time

	draining atomic.Bool
	// heartbeatMu makes this instance's heartbeats one at a time, each built
	// (its time, its draining mark) only once the one before it is written:
	// Run's ticks, a test's Tick and SetDraining would otherwise race, and
	// a heartbeat built earlier but written later would take the instance's
	// row back in time (seen dead by the others) or drop its draining mark.
	heartbeatMu sync.Mutex

	mu        sync.RWMutex
	instances map[string]sessionstore.Instance // the last ListInstances, by id
	// loaded is set, under mu, once instances has been read: atomic, so
	// that every decision's check (ensureLoaded) takes no lock.
	loaded atomic.Bool
	// seenConnected holds, per instance, the StartedAt of the process last
	// seen connected by Probe; gone marks those whose process was seen
	// connected and no longer is.
	seenConnected map[string]time.Time
	gone          map[string]bool
	probeServer   string     // the server that seenConnected was seen on
	lastRead      time.Time  // the latest successful read of the instance table
	outage        outage     // the latest span the table could not be read
	lastProbe     time.Time  // when Probe last read the prober
	probeTried    time.Time  // when a probe was last started, whatever came of it
	probeMu       sync.Mutex // one probe at a time from runProbe, fresh and confirmHealthy
	// demand is set when a decision reads the view of another instance
	// (fresh), and cleared by runProbe, which probes only when it was set.
	demand atomic.Bool
	// loadMu guards loading, the read of the instance table that the
	// decisions made before the first tick share (ensureLoaded; nil when
	// none is under way), and stopped, set once Fabric.Run has returned
	// (stopLoads): from then on no read starts a goroutine. loads waits
	// for those goroutines.
	loadMu  sync.Mutex
	loading *firstRead
	stopped bool
	loads   sync.WaitGroup
}

// firstRead is one read of the instance table shared by the decisions made
// before the first tick: done is closed once err is set.
type firstRead struct {
	done chan struct{}
	err  error
}

func newMembers(cfg Config, d Deps) *Members {
	return &Members{
		cfg: cfg, store: d.Store, prober: d.Prober, now: d.Now, log: d.Logger, busKeyVersion: d.BusKeyVersion,
		startedAt: d.Now(), instances: map[string]sessionstore.Instance{},
		seenConnected: map[string]time.Time{}, gone: map[string]bool{},
	}
}

// InstanceID is this instance's id.
func (m *Members) InstanceID() string { return m.cfg.InstanceID }

// StartedAt is when this process started: its heartbeats' StartedAt, which
// tells it from the other processes of its instance id.
func (m *Members) StartedAt() time.Time { return m.startedAt }

// Tick is one heartbeat of this instance followed by a refresh of the view,
// and a probe when the view holds a process not yet seen connected (a new
// instance, a restart, a failed-over server) or a decision read the view
// since runProbe last looked; other probes are runProbe's and fresh's.
func (m *Members) Tick(ctx context.Context) error {
	hb := m.heartbeat(ctx)
	if err := m.Refresh(ctx); err != nil {
		return errors.Join(hb, err)
	}
	if !m.unseen() && !m.demand.Load() {
		return hb
	}
	m.probeMu.Lock()
	defer m.probeMu.Unlock()
	m.noteProbeTried()
	return errors.Join(hb, m.Probe(ctx))
}

func (m *Members) heartbeat(ctx context.Context) error {
	m.heartbeatMu.Lock()
	defer m.heartbeatMu.Unlock()
	busKey := m.busKeyVersion(ctx) // first: it may read the key, and the heartbeat's time follows
	err := m.store.HeartbeatInstance(ctx, sessionstore.Instance{
		ID: m.cfg.InstanceID, URL: m.cfg.PublicURL, Draining: m.draining.Load(),
		StartedAt: m.startedAt, LastHeartbeatAt: m.now(), BusKeyVersion: busKey,
	})
	if err != nil {
		return fmt.Errorf("heartbeat instance %s: %w", m.cfg.InstanceID, err)
	}
	return nil
}

// Refresh reloads the instance table: the health view that Healthy and
// marconi_instance_healthy read.
func (m *Members) Refresh(ctx context.Context) error {
	list, err := m.store.ListInstances(ctx)
	if err != nil {
		m.readFailed()
		return fmt.Errorf("list instances: %w", err)
	}
	byID := make(map[string]sessionstore.Instance, len(list))
	for _, in := range list {
		byID[in.ID] = in
	}
	m.mu.Lock()
	m.instances = byID
	m.loaded.Store(true)
	m.readSucceeded()
	m.mu.Unlock()
	return nil
}

// ensureLoaded reads the instance table once when no tick has yet: a
// decision made on an empty view would take every session over, and would
// judge every other instance dead (a send to a queue attached on a live
// peer answered queued_offline). The hub serves before Run's first tick
// has read the table, which under load can take a while, so every
// decision that reads the view comes here first. Concurrent calls share
// one read, which runs on a goroutine of its own, bounded by StoreTimeout
// and not by any caller's context: a first request cancelled (its client
// gone, its deadline passed) must not leave the others the empty view.
// Each caller waits on its own context.
func (m *Members) ensureLoaded(ctx context.Context) error {
	if m.loaded.Load() {
		return nil
	}
	m.loadMu.Lock()
	r := m.loading
	if r == nil {
		r = &firstRead{done: make(chan struct{})}
		m.loading = r
		if m.stopped {
			// Run is over: nobody would wait for a goroutine.
			m.loadMu.Unlock()
			m.firstRead(context.WithoutCancel(ctx), r)
			return r.err
		}
		m.loads.Add(1)
		go func() {
			defer m.loads.Done()
			m.firstRead(context.WithoutCancel(ctx), r)
		}()
	}
	m.loadMu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("first read of the instance table: %w", ctx.Err())
	}
}

// firstRead runs r, the shared read of ensureLoaded, bounded by
// StoreTimeout; a read that failed is tried again by the next decision.
func (m *Members) firstRead(ctx context.Context, r *firstRead) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	defer cancel()
	r.err = m.Refresh(ctx)
	m.loadMu.Lock()
	m.loading = nil
	m.loadMu.Unlock()
	close(r.done)
}

// stopLoads waits for the shared first read under way, if any, and makes
// the later ones run on their callers' goroutines.
func (m *Members) stopLoads() {
	m.loadMu.Lock()
	m.stopped = true
	m.loadMu.Unlock()
	m.loads.Wait()
}

// SetDraining marks this instance draining, in the store at once (a final
// heartbeat with Draining set), so that the others see it unhealthy now
// rather than after the dead-after window. Later heartbeats keep the mark.
func (m *Members) SetDraining(ctx context.Context) error {
	if !m.draining.CompareAndSwap(false, true) {
		return nil
	}
	return m.heartbeat(ctx)
}

// Healthy reports whether instance is healthy: its heartbeat is younger than
// DeadAfter, it is not draining and its process was not seen gone. It reads
// the view kept by Tick (read now when no tick has yet), after a probe when
// none was tried within ProbeEvery (fresh). This instance is healthy while
// it is not draining.
func (m *Members) Healthy(ctx context.Context, instance string) bool {
	if instance == m.cfg.InstanceID {
		return !m.draining.Load()
	}
	m.fresh(ctx)
	m.mu.RLock()
	defer m.mu.RUnlock()
	in, ok := m.instances[instance]
	return ok && m.healthyAt(in, m.now())
}

// HoldsQueue reports whether instance still holds a queue recorded as
// attached there at attachedAt: the instance is healthy, and the process that
// answers for its id has run since then (attachedAt is not before its
// StartedAt). A queue recorded before the instance's StartedAt died with an
// earlier process of the same MARCONI_INSTANCE_ID: a crash leaves it in the
// store, since nothing cleared it. Both times come from that instance's own
// clock. It reads the view kept by Tick (read now when no tick has yet),
// after a probe when none was tried within ProbeEvery (fresh).
func (m *Members) HoldsQueue(ctx context.Context, instance string, attachedAt time.Time) bool {
	if instance == m.cfg.InstanceID {
		return !m.draining.Load() && !attachedAt.Before(m.startedAt)
	}
	m.fresh(ctx)
	m.mu.RLock()
	defer m.mu.RUnlock()
	in, ok := m.instances[instance]
	return ok && m.healthyAt(in, m.now()) && !attachedAt.Before(in.StartedAt)
}

// restartedSince returns the StartedAt of instance in the view when its
// process started after at (the queue recorded at at died with an earlier
// process of the same id), and false otherwise.
func (m *Members) restartedSince(instance string, at time.Time) (time.Time, bool) {
	m.mu.RLock()
	in, ok := m.instances[instance]
	m.mu.RUnlock()
	if !ok || !in.StartedAt.After(at) {
		return time.Time{}, false
	}
	return in.StartedAt, true
}

// lastHeartbeat is instance's last heartbeat in the view (zero when unknown).
func (m *Members) lastHeartbeat(instance string) time.Time {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.instances[instance].LastHeartbeatAt
}

// healthyOthers lists the healthy instances of the view but this one, by id,
// after a probe when none was tried within ProbeEvery (fresh).
func (m *Members) healthyOthers(ctx context.Context) []string {
	m.fresh(ctx)
	now := m.now()
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []string
	for _, id := range sortedKeys(m.instances) {
		if id != m.cfg.InstanceID && m.healthyAt(m.instances[id], now) {
			out = append(out, id)
		}
	}
	return out
}

// healthyAt reports whether in is healthy at now: not draining, a heartbeat
// younger than DeadAfter (not counting a store outage: heartbeatAge), and
// its process not seen gone (Probe). The caller holds m.mu (read or write)
// or owns in's view otherwise.
func (m *Members) healthyAt(in sessionstore.Instance, now time.Time) bool {
	if in.ID == m.cfg.InstanceID {
		return !m.draining.Load()
	}
	return !in.Draining && m.heartbeatAge(in.LastHeartbeatAt, now) < m.cfg.DeadAfter && !m.gone[in.ID]
}

// Reporter reports whether this instance is the one that exports the
// cluster-wide gauges: it is healthy and no healthy instance in the view has
// a lower id. Every instance decides from its own view (read now when no
// tick has yet: ensureLoaded), without a store call; for about one
// heartbeat after a change two instances, or none, may claim it.
func (m *Members) Reporter(ctx context.Context) bool {
	if m.draining.Load() {
		return false
	}
	if err := m.ensureLoaded(ctx); err != nil {
		m.log.Debug("first read of the instance table before the reporter's choice", "err", err)
	}
	now := m.now()
	m.mu.RLock()
	defer m.mu.RUnlock()
	for id, in := range m.instances {
		if id < m.cfg.InstanceID && m.healthyAt(in, now) {
			return false
		}
	}
	return true
}

// URL is the public URL of instance, from the instance table (read now
// when no tick has yet: ensureLoaded); empty when the instance is unknown.
func (m *Members) URL(ctx context.Context, instance string) string {
	if instance == m.cfg.InstanceID {
		return m.cfg.PublicURL
	}
	if err := m.ensureLoaded(ctx); err != nil {
		m.log.Debug("first read of the instance table before an instance's URL", "instance", instance, "err", err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.instances[instance].URL
}
