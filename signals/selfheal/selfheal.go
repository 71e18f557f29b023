package selfheal

import (
	"errors"
	"fmt"
	"time"

	"github.com/marconihub/marconi"
)

// Outcome is the result of one side's evaluation: the wire's
// selfheal_outcome, declared with its values in the root package.
type Outcome = marconi.Outcome

// Side is a side of a send that is evaluated; each has its own token buckets.
type Side string

// Sides of a send.
const (
	SideRecipient Side = "recipient"
	SideSender    Side = "sender"
)

// Surface is what kind of agent a session is; its Live method decides the
// surface gate. It is the wire's surface, declared with its values in the
// root package.
type Surface = marconi.Surface

// DefaultEnabled is the default of MARCONI_SELFHEAL for a MARCONI_MODE: on in
// development, off in lan and cloud until the AC-9 promotion gate is passed.
// An unknown mode is off.
func DefaultEnabled(mode marconi.DeploymentMode) bool {
	return mode == marconi.Development
}

// Config holds the self-heal knobs. cmd/marconi fills it from the environment;
// the field comments name the variable and the default.
type Config struct {
	// Enabled is MARCONI_SELFHEAL (alias PRISM_MARCONI_SELFHEAL; the former
	// wins when both are set). Default DefaultEnabled(MARCONI_MODE).
	Enabled bool
	// Freshness is MARCONI_SELFHEAL_FRESHNESS_SECONDS (300): the recipient's
	// recency gate, also the route_state freshness window.
	Freshness time.Duration
	// SenderStaleThreshold is MARCONI_SELFHEAL_SENDER_STALE_THRESHOLD_SECONDS
	// (600): the sender's recency gate.
	SenderStaleThreshold time.Duration
	// MaxAttempts is MARCONI_SELFHEAL_MAX_ATTEMPTS_PER_SESSION (3): the
	// capacity of each token bucket.
	MaxAttempts int
	// RefillPeriod is MARCONI_SELFHEAL_TOKEN_REFILL_SECONDS (60): an empty
	// bucket refills linearly to MaxAttempts over this period.
	RefillPeriod time.Duration
}

// Defaults of the Config knobs, each set here only.
const (
	DefaultFreshness            = 300 * time.Second
	DefaultSenderStaleThreshold = 600 * time.Second
	DefaultMaxAttempts          = 3
	DefaultRefillPeriod         = 60 * time.Second
)

// DefaultConfig returns the documented defaults for MARCONI_MODE=development
// (the default mode), so Enabled is true.
func DefaultConfig() Config { return Config{}.WithDefaults(marconi.Development) }

// WithDefaults returns c with each zero knob set to its default, each
// applied here only. A zero Config is the defaults of mode, Enabled
// included (DefaultEnabled); otherwise Enabled is as given.
func (c Config) WithDefaults(mode marconi.DeploymentMode) Config {
	if c == (Config{}) {
		c.Enabled = DefaultEnabled(mode)
	}
	if c.Freshness == 0 {
		c.Freshness = DefaultFreshness
	}
	if c.SenderStaleThreshold == 0 {
		c.SenderStaleThreshold = DefaultSenderStaleThreshold
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.RefillPeriod == 0 {
		c.RefillPeriod = DefaultRefillPeriod
	}
	return c
}

// ErrInvalidConfig is returned (wrapped) by Config.Validate and New when a knob
// is out of range; the message opens with the environment variable, as every
// configuration error the hub prints does.
var ErrInvalidConfig = errors.New("invalid self-heal config")

// maxAttemptsLimit keeps bucket arithmetic exact in float64 and the knob sane.
const maxAttemptsLimit = 1_000_000

// Validate checks every knob, whether or not self-heal is enabled (the
// freshness window is used by route_state either way). The error wraps
// ErrInvalidConfig and names the variable.
func (c Config) Validate() error {
	switch {
	case c.Freshness <= 0:
		return fmt.Errorf("MARCONI_SELFHEAL_FRESHNESS_SECONDS: must be positive, got %v (%w)", c.Freshness, ErrInvalidConfig)
	case c.SenderStaleThreshold <= 0:
		return fmt.Errorf("MARCONI_SELFHEAL_SENDER_STALE_THRESHOLD_SECONDS: must be positive, got %v (%w)", c.SenderStaleThreshold, ErrInvalidConfig)
	case c.MaxAttempts < 1 || c.MaxAttempts > maxAttemptsLimit:
		return fmt.Errorf("MARCONI_SELFHEAL_MAX_ATTEMPTS_PER_SESSION: must be between 1 and %d, got %d (%w)", maxAttemptsLimit, c.MaxAttempts, ErrInvalidConfig)
	case c.RefillPeriod <= 0:
		return fmt.Errorf("MARCONI_SELFHEAL_TOKEN_REFILL_SECONDS: must be positive, got %v (%w)", c.RefillPeriod, ErrInvalidConfig)
	}
	return nil
}
