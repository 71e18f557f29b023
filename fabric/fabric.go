package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
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
	// asks the prober (Deps.Prober) which instances' processes are still
	// connected, while decisions read the view or a process is still to be
	// seen connected; no decision reads a liveness older than this, so a
	// killed instance is seen dead within about this long.
	ProbeEvery time.Duration
	// Grace is MARCONI_RECONNECT_GRACE_SECONDS (60).
	Grace time.Duration
	// StoreTimeout is MARCONI_STORE_TIMEOUT_SECONDS (3): it bounds the read
	// of the instance table that the decisions made before the first tick
	// share, which no one caller's cancellation ends (ensureLoaded).
	StoreTimeout time.Duration
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
	DefaultStoreTimeout     = 3 * time.Second // also the hub's (hub.DefaultStoreTimeout)
	DefaultDisconnectPolicy = PolicyRetain
	DefaultRuntimeMode      = ModeStateless
	DefaultStickyPlacement  = StickyByLoad
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
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.DisconnectPolicy == "" {
		c.DisconnectPolicy = DefaultDisconnectPolicy
	}
	if c.Placement.DefaultMode == "" {
		c.Placement.DefaultMode = DefaultRuntimeMode
	}
	if c.Placement.Sticky == "" {
		c.Placement.Sticky = DefaultStickyPlacement
	}
}

// validate refuses what New cannot run with.
func (c *Config) validate() error {
	if c.InstanceID == "" {
		return errors.New("fabric: no instance id")
	}
	// A reserved or unknown default runtime mode is refused here too, not
	// only when the environment is parsed.
	if _, err := NormalizeRuntimeMode(c.Placement.DefaultMode); err != nil {
		return fmt.Errorf("fabric: default runtime mode: %w", err)
	}
	if c.Placement.Sticky != StickyByLoad && c.Placement.Sticky != StickyByProject {
		return fmt.Errorf("fabric: sticky placement %q (want fewest or project)", c.Placement.Sticky)
	}
	switch c.DisconnectPolicy {
	case PolicyRetain, PolicyDrop:
		return nil
	default:
		return fmt.Errorf("fabric: disconnect policy %q (want retain or drop)", c.DisconnectPolicy)
	}
}

// Deps are the collaborators of the fabric.
type Deps struct {
	Store sessionstore.Store
	// Prober sees which instances' processes are alive (pgstore.Bus); nil
	// leaves health to the heartbeat alone.
	Prober Prober
	// BusKeyVersion is the version of the bus key this instance seals
	// wake-ups with (pgstore.Store.LoadBusKey: read at the first heartbeat
	// if not before; 0 while it cannot be), which each heartbeat writes so
	// that the summary shows who picked a rotation up; nil writes 0,
	// unknown (a store without a bus key).
	BusKeyVersion func(ctx context.Context) int64
	// Now is the clock; nil means time.Now.
	Now      func() time.Time
	Registry prometheus.Registerer // nil: a registry of its own
	Logger   *slog.Logger          // nil: discard
}

// Fabric is one instance's part in the fabric, by role: Members keeps the
// instance table and who is alive, Placer decides each attach and places
// sticky sessions, Canary is the adaptive classifier's gate. Each is built
// on the ones before it. The wake bus between instances (Bus) is the
// connection hub's, not the fabric's: the fabric only declares it. It is
// safe for concurrent use.
type Fabric struct {
	Members *Members
	Placer  *Placer
	Canary  *Canary
	store   sessionstore.Store
	now     func() time.Time
	log     *slog.Logger
}

// New builds the fabric for one instance, its roles in dependency order.
// Its metrics are registered on d.Registry.
func New(cfg Config, d Deps) (*Fabric, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if d.Store == nil {
		return nil, errors.New("fabric: no store")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.BusKeyVersion == nil {
		d.BusKeyVersion = func(context.Context) int64 { return 0 }
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Registry == nil {
		d.Registry = prometheus.NewRegistry()
	}
	m, err := newMetrics(d.Registry)
	if err != nil {
		return nil, err
	}
	members := newMembers(cfg, d)
	if err := d.Registry.Register(healthCollector{members}); err != nil {
		return nil, err
	}
	return &Fabric{
		Members: members,
		Placer:  newPlacer(cfg, members, d, m),
		Canary:  newCanary(cfg.Placement, d, m),
		store:   d.Store, now: d.Now, log: d.Logger,
	}, nil
}

// Run heartbeats this instance into the store and refreshes the view of the
// others and the canary's gate at once and then every HeartbeatEvery, and
// probes the others' processes every ProbeEvery while anything needs it
// (runProbe), until ctx ends. A failed tick (store unreachable) is logged
// and retried on the next one.
func (f *Fabric) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	defer f.Members.stopLoads()
	if f.Members.prober != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.Members.runProbe(ctx)
		}()
	}
	t := time.NewTicker(f.Members.cfg.HeartbeatEvery)
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

// Tick is one heartbeat of this instance, a refresh of the view and a
// probe (Members.Tick), then a refresh of the canary's gate. Run calls it
// on its timer; tests call it to decide health without waiting.
func (f *Fabric) Tick(ctx context.Context) error {
	return errors.Join(f.Members.Tick(ctx), f.Canary.Refresh(ctx))
}
