package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/sessionstore"
)

// Disconnect policies (MARCONI_DISCONNECT_POLICY).
const (
	PolicyRetain = "retain"
	PolicyDrop   = "drop"
)

// Config configures one instance's view of the fabric.
type Config struct {
	// InstanceID is MARCONI_INSTANCE_ID.
	InstanceID string
	// PublicURL is MARCONI_PUBLIC_URL: where clients reach this instance.
	PublicURL string
	// DeadAfter is MARCONI_INSTANCE_DEAD_AFTER_SECONDS (10): an instance whose
	// heartbeat is older is unhealthy.
	DeadAfter time.Duration
	// HeartbeatEvery is MARCONI_INSTANCE_HEARTBEAT_SECONDS (3): how often Run
	// heartbeats this instance and refreshes its view of the others. Keep it
	// well under half of DeadAfter: a peer's health is judged from a view up
	// to one interval old.
	HeartbeatEvery time.Duration
	// ProbeEvery is MARCONI_INSTANCE_PROBE_MILLISECONDS (500): how often Run
	// asks the prober (SetProber) which instances' processes are still
	// connected, so a killed instance is seen dead within about this long.
	ProbeEvery time.Duration
	// Grace is MARCONI_RECONNECT_GRACE_SECONDS (60).
	Grace time.Duration
	// DisconnectPolicy is retain (default) or drop.
	DisconnectPolicy string
	// Placement resolves runtime modes.
	Placement PlacementConfig
}

// Defaults of Config's zero fields, each set here only.
const (
	DefaultDeadAfter        = 10 * time.Second
	DefaultHeartbeatEvery   = 3 * time.Second
	DefaultProbeEvery       = 500 * time.Millisecond
	DefaultGrace            = 60 * time.Second
	DefaultDisconnectPolicy = PolicyRetain
	DefaultRuntimeMode      = ModeStateless
)

func (c *Config) setDefaults() {
	if c.DeadAfter == 0 {
		c.DeadAfter = DefaultDeadAfter
	}
	if c.HeartbeatEvery == 0 {
		c.HeartbeatEvery = DefaultHeartbeatEvery
	}
	if c.ProbeEvery == 0 {
		c.ProbeEvery = DefaultProbeEvery
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.DisconnectPolicy == "" {
		c.DisconnectPolicy = DefaultDisconnectPolicy
	}
	if c.Placement.DefaultMode == "" {
		c.Placement.DefaultMode = DefaultRuntimeMode
	}
}

// Fabric is one instance's part in the fabric: it heartbeats the instance
// into the store, keeps a view of every instance's health, places sticky
// sessions and decides each attach. It never hydrates state. It is safe for
// concurrent use.
type Fabric struct {
	cfg       Config
	store     sessionstore.Store
	now       func() time.Time
	log       *slog.Logger
	m         *metrics
	bus       Bus    // set by SetBus (wake.go)
	prober    Prober // set by SetProber (liveness.go); nil: heartbeat only
	startedAt time.Time

	draining   atomic.Bool
	rolledBack atomic.Bool

	mu        sync.RWMutex
	instances map[string]sessionstore.Instance // the last ListInstances, by id
	loaded    bool                             // instances has been read at least once
	// seenConnected holds, per instance, the StartedAt of the process last
	// seen connected by Probe; gone marks those whose process was seen
	// connected and no longer is.
	seenConnected map[string]time.Time
	gone          map[string]bool
	probeServer   string     // the server that seenConnected was seen on
	lastRead      time.Time  // the latest successful read of the instance table
	outage        outage     // the latest span the table could not be read
	lastProbe     time.Time  // when Probe last read the prober
	probeMu       sync.Mutex // serializes confirmHealthy's probes
}

// New builds the fabric for one instance. Its metrics are registered on reg.
// A reserved or unknown default runtime mode is refused here too, not only
// when the environment is parsed.
func New(cfg Config, store sessionstore.Store, now func() time.Time, reg prometheus.Registerer, log *slog.Logger) (*Fabric, error) {
	cfg.setDefaults()
	if cfg.InstanceID == "" {
		return nil, errors.New("fabric: no instance id")
	}
	if _, err := NormalizeRuntimeMode(string(cfg.Placement.DefaultMode)); err != nil {
		return nil, fmt.Errorf("fabric: default runtime mode: %w", err)
	}
	switch cfg.DisconnectPolicy {
	case PolicyRetain, PolicyDrop:
	default:
		return nil, fmt.Errorf("fabric: disconnect policy %q (want retain or drop)", cfg.DisconnectPolicy)
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	f := &Fabric{
		cfg: cfg, store: store, now: now, log: log, m: m, bus: NoBus{},
		startedAt: now(), instances: map[string]sessionstore.Instance{},
		seenConnected: map[string]time.Time{}, gone: map[string]bool{},
	}
	if err := reg.Register(healthCollector{f}); err != nil {
		return nil, err
	}
	return f, nil
}

// InstanceID is this instance's id.
func (f *Fabric) InstanceID() string { return f.cfg.InstanceID }

// Run heartbeats this instance into the store and refreshes the view of the
// others at once and then every HeartbeatEvery, and probes the others'
// processes every ProbeEvery, until ctx ends. A failed tick (store
// unreachable) is logged and retried on the next one.
func (f *Fabric) Run(ctx context.Context) error {
	if f.prober != nil {
		done := make(chan struct{})
		defer func() { <-done }()
		go func() {
			defer close(done)
			f.runProbe(ctx)
		}()
	}
	t := time.NewTicker(f.cfg.HeartbeatEvery)
	defer t.Stop()
	for {
		if err := f.Tick(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("fabric heartbeat", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Tick is one heartbeat of this instance followed by a refresh of the view
// and a probe. Run calls it on its timer; tests call it to decide health
// without waiting.
func (f *Fabric) Tick(ctx context.Context) error {
	hb := f.heartbeat(ctx)
	if err := f.Refresh(ctx); err != nil {
		return errors.Join(hb, err)
	}
	return errors.Join(hb, f.Probe(ctx))
}

func (f *Fabric) heartbeat(ctx context.Context) error {
	err := f.store.HeartbeatInstance(ctx, sessionstore.Instance{
		ID: f.cfg.InstanceID, URL: f.cfg.PublicURL, Draining: f.draining.Load(),
		StartedAt: f.startedAt, LastHeartbeatAt: f.now(),
	})
	if err != nil {
		return fmt.Errorf("heartbeat instance %s: %w", f.cfg.InstanceID, err)
	}
	return nil
}

// Refresh reloads the instance table and the cluster-wide counters: the
// health view that Healthy and marconi_instance_healthy read, and the
// rollback of the adaptive gate.
func (f *Fabric) Refresh(ctx context.Context) error {
	list, err := f.store.ListInstances(ctx)
	if err != nil {
		f.readFailed()
		return fmt.Errorf("list instances: %w", err)
	}
	byID := make(map[string]sessionstore.Instance, len(list))
	for _, in := range list {
		byID[in.ID] = in
	}
	f.mu.Lock()
	f.instances, f.loaded = byID, true
	f.readSucceeded()
	f.mu.Unlock()

	c, err := f.store.Counts(ctx)
	if err != nil {
		return fmt.Errorf("counts: %w", err)
	}
	f.checkRollback(c)
	return nil
}

// ensureLoaded reads the instance table once when no tick has yet: a
// decision made on an empty view would take every session over.
func (f *Fabric) ensureLoaded(ctx context.Context) error {
	f.mu.RLock()
	loaded := f.loaded
	f.mu.RUnlock()
	if loaded {
		return nil
	}
	return f.Refresh(ctx)
}

// SetDraining marks this instance draining, in the store at once (a final
// heartbeat with Draining set), so that the others see it unhealthy now
// rather than after the dead-after window. Later heartbeats keep the mark.
func (f *Fabric) SetDraining(ctx context.Context) error {
	if !f.draining.CompareAndSwap(false, true) {
		return nil
	}
	return f.heartbeat(ctx)
}

// Healthy reports whether instance is healthy: its heartbeat is younger than
// DeadAfter and it is not draining. It reads the view kept by Tick and makes
// no store call. This instance is healthy while it is not draining.
func (f *Fabric) Healthy(ctx context.Context, instance string) bool {
	if instance == f.cfg.InstanceID {
		return !f.draining.Load()
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	in, ok := f.instances[instance]
	return ok && f.healthyAt(in, f.now())
}

// HoldsQueue reports whether instance still holds a queue recorded as
// attached there at attachedAt: the instance is healthy, and the process that
// answers for its id has run since then (attachedAt is not before its
// StartedAt). A queue recorded before the instance's StartedAt died with an
// earlier process of the same MARCONI_INSTANCE_ID: a crash leaves it in the
// store, since nothing cleared it. Both times come from that instance's own
// clock. It reads the view kept by Tick and makes no store call.
func (f *Fabric) HoldsQueue(ctx context.Context, instance string, attachedAt time.Time) bool {
	if instance == f.cfg.InstanceID {
		return !f.draining.Load() && !attachedAt.Before(f.startedAt)
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	in, ok := f.instances[instance]
	return ok && f.healthyAt(in, f.now()) && !attachedAt.Before(in.StartedAt)
}

// restartedSince returns the StartedAt of instance in the view when its
// process started after at (the queue recorded at at died with an earlier
// process of the same id), and false otherwise.
func (f *Fabric) restartedSince(instance string, at time.Time) (time.Time, bool) {
	f.mu.RLock()
	in, ok := f.instances[instance]
	f.mu.RUnlock()
	if !ok || !in.StartedAt.After(at) {
		return time.Time{}, false
	}
	return in.StartedAt, true
}

// healthyAt reports whether in is healthy at now: not draining, a heartbeat
// younger than DeadAfter (not counting a store outage: heartbeatAge), and
// its process not seen gone (Probe). The caller holds f.mu (read or write)
// or owns in's view otherwise.
func (f *Fabric) healthyAt(in sessionstore.Instance, now time.Time) bool {
	if in.ID == f.cfg.InstanceID {
		return !f.draining.Load()
	}
	return !in.Draining && f.heartbeatAge(in.LastHeartbeatAt, now) < f.cfg.DeadAfter && !f.gone[in.ID]
}

// Reporter reports whether this instance is the one that exports the
// cluster-wide gauges: it is healthy and no healthy instance in the view has
// a lower id. Every instance decides from its own view, without a store
// call; for about one heartbeat after a change two instances, or none, may
// claim it.
func (f *Fabric) Reporter() bool {
	if f.draining.Load() {
		return false
	}
	now := f.now()
	f.mu.RLock()
	defer f.mu.RUnlock()
	for id, in := range f.instances {
		if id < f.cfg.InstanceID && f.healthyAt(in, now) {
			return false
		}
	}
	return true
}

// URL is the public URL of instance, from the instance table; empty when
// the instance is unknown.
func (f *Fabric) URL(instance string) string {
	if instance == f.cfg.InstanceID {
		return f.cfg.PublicURL
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.instances[instance].URL
}

// Wake tells instance that k has a new signal, through the bus (wake.go).
func (f *Fabric) Wake(ctx context.Context, instance string, k sessionstore.Key, seq int64) {
	f.wake(ctx, instance, k, seq)
}

// Assign picks the instance a new sticky session is placed on: the healthy
// instance with the fewest live sticky sessions assigned to it (ties go to
// this instance, then to the lowest id). The load is read from the store at
// each call, so concurrent registrations on several instances see each
// other's assignments.
func (f *Fabric) Assign(ctx context.Context) (string, error) {
	if err := f.ensureLoaded(ctx); err != nil {
		return "", err
	}
	stats, err := f.store.SessionStats(ctx, f.now())
	if err != nil {
		return "", fmt.Errorf("assign: %w", err)
	}
	best, bestLoad := f.cfg.InstanceID, stats.ByAssignedInstance[f.cfg.InstanceID]
	if !f.Healthy(ctx, best) {
		best, bestLoad = "", 0
	}
	now := f.now()
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, id := range sortedKeys(f.instances) {
		if id == f.cfg.InstanceID || !f.healthyAt(f.instances[id], now) {
			continue
		}
		if load := stats.ByAssignedInstance[id]; best == "" || load < bestLoad {
			best, bestLoad = id, load
		}
	}
	if best == "" {
		// Nobody is healthy, this instance included (it is draining and the
		// caller let a registration through): keep it here.
		best = f.cfg.InstanceID
	}
	return best, nil
}
