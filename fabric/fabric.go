package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/marconihub/marconi"
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
	// Grace is MARCONI_RECONNECT_GRACE_SECONDS (60).
	Grace time.Duration
	// DisconnectPolicy is retain (default) or drop.
	DisconnectPolicy string
	// Placement resolves runtime modes.
	Placement PlacementConfig
}

func (c *Config) setDefaults() {
	if c.DeadAfter == 0 {
		c.DeadAfter = 10 * time.Second
	}
	if c.Grace == 0 {
		c.Grace = 60 * time.Second
	}
	if c.DisconnectPolicy == "" {
		c.DisconnectPolicy = PolicyRetain
	}
	if c.Placement.DefaultMode == "" {
		c.Placement.DefaultMode = ModeStateless
	}
}

// Fabric is one instance's part in the fabric. It is safe for concurrent use.
type Fabric struct {
	cfg   Config
	store sessionstore.Store
	now   func() time.Time
	log   *slog.Logger
	bus   Bus // wake-ups to other instances (wake.go)
}

// New builds the fabric for one instance.
func New(cfg Config, store sessionstore.Store, now func() time.Time, log *slog.Logger) (*Fabric, error) {
	cfg.setDefaults()
	if cfg.InstanceID == "" {
		return nil, errors.New("fabric: no instance id")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Fabric{cfg: cfg, store: store, now: now, log: log}, nil
}

// InstanceID is this instance's id.
func (f *Fabric) InstanceID() string { return f.cfg.InstanceID }

// Open implements AdaptiveGate from the configuration.
func (f *Fabric) Open(clientID string) bool {
	return f.cfg.Placement.Adaptive && allowlisted(f.cfg.Placement.AdaptiveClients, clientID)
}

// RuntimeMode resolves a new session's mode and source.
func (f *Fabric) RuntimeMode(explicit, clientID string, h Hints) (mode, source string) {
	return ResolveMode(explicit, clientID, h, f, f.cfg.Placement.DefaultMode)
}

// Assign picks the instance a new sticky session is placed on.
func (f *Fabric) Assign(ctx context.Context) (string, error) {
	return f.cfg.InstanceID, nil
}

// URL is the public URL of instance.
func (f *Fabric) URL(instance string) string {
	return f.cfg.PublicURL
}

// CountAdaptivePlacement counts a session placed by the classifier.
func (f *Fabric) CountAdaptivePlacement(ctx context.Context) {
	if err := f.store.AddCount(ctx, sessionstore.CounterAdaptivePlacements, 1); err != nil {
		f.log.Warn("count adaptive placement", "err", err)
	}
}

// Healthy reports whether instance is healthy.
func (f *Fabric) Healthy(ctx context.Context, instance string) bool {
	return instance == f.cfg.InstanceID
}

// Wake tells instance that k has a new signal, over the bus (wake.go).
func (f *Fabric) Wake(ctx context.Context, instance string, k sessionstore.Key, seq int64) {
	f.wake(ctx, instance, k, seq)
}

// Placement is the outcome of an attach's placement decision.
type Placement struct {
	// Resumed: an earlier attachment ended within the grace window and the
	// affinity holds.
	Resumed bool
	// AffinityReset: runtime-local state is gone; the client must rehydrate.
	AffinityReset bool
	// Dropped is how many pending signals the drop policy discarded, when it applied.
	Dropped *int
}

// Place decides whether sess may attach on this instance. A sticky session
// whose assigned instance is another healthy one gets wrong_instance.
func (f *Fabric) Place(ctx context.Context, sess sessionstore.Session, hasLocalQueue bool) (Placement, error) {
	now := f.now()
	var p Placement
	withinGrace := !sess.QueueDetachedAt.IsZero() && now.Sub(sess.QueueDetachedAt) <= f.cfg.Grace
	if sess.RuntimeMode != ModeSticky {
		p.Resumed = withinGrace || hasLocalQueue
		return p, nil
	}
	if sess.AssignedInstance != "" && sess.AssignedInstance != f.cfg.InstanceID && f.Healthy(ctx, sess.AssignedInstance) {
		return p, &marconi.Error{
			Code:        marconi.CodeWrongInstance,
			Message:     fmt.Sprintf("session %q is placed on instance %q; attach there", sess.SessionID, sess.AssignedInstance),
			InstanceID:  sess.AssignedInstance,
			InstanceURL: f.URL(sess.AssignedInstance),
		}
	}
	p.Resumed = withinGrace || hasLocalQueue
	return p, nil
}
