package selfheal

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Outcomes of one side's evaluation, exactly the SPEC-168 AC-8 enum (null is
// the empty string). They are also the only label values of
// marconi_route_self_healed_total.
const (
	// OutcomeAttempted: the side has no queue but recent proof of life; the
	// hint (*_route_stale: true) is set and a token was spent.
	OutcomeAttempted = "attempted"
	// OutcomeSucceeded is reserved for a future server-observed reconnect.
	OutcomeSucceeded = "succeeded"
	// OutcomeNoListener is reserved for a future confirmation that no live
	// WebSocket handler exists.
	OutcomeNoListener = "no_listener"
	// OutcomeRateLimited: the side's token bucket is empty; no hint is set.
	OutcomeRateLimited = "rate_limited"
	// OutcomeStaleRecency: the side's freshest proof of life is too old; it is
	// treated as genuinely offline and no hint is set.
	OutcomeStaleRecency = "stale_recency"
	// OutcomeUnsupportedSurface: the recipient's surface has no persistent
	// WebSocket (codex, piggyback only); no hint is set.
	OutcomeUnsupportedSurface = "unsupported_surface"
	// OutcomeFailed is reserved for a future transient error in detection.
	OutcomeFailed = "failed"
)

// AllOutcomes returns the outcome enum in its documented order. It returns a
// fresh slice each call, so callers may keep or change it.
func AllOutcomes() []string {
	return []string{
		OutcomeAttempted,
		OutcomeSucceeded,
		OutcomeNoListener,
		OutcomeRateLimited,
		OutcomeStaleRecency,
		OutcomeUnsupportedSurface,
		OutcomeFailed,
	}
}

// Sides of a send that are evaluated; each has its own token buckets.
const (
	SideRecipient = "recipient"
	SideSender    = "sender"
)

// LiveSurface reports whether a surface keeps a persistent WebSocket and so can
// be healed by a reconnect: claude_code, headless_cc, headless_cx and
// console_<name> with a non-empty name. codex (piggyback only) and anything
// else are not live.
func LiveSurface(surface string) bool {
	switch surface {
	case "claude_code", "headless_cc", "headless_cx":
		return true
	}
	name, ok := strings.CutPrefix(surface, "console_")
	return ok && name != ""
}

// DefaultEnabled is the default of MARCONI_SELFHEAL for a MARCONI_MODE: on in
// development, off in lan and cloud until the AC-9 promotion gate is passed.
// An unknown mode is off.
func DefaultEnabled(mode string) bool {
	return mode == "development"
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

// DefaultConfig returns the documented defaults for MARCONI_MODE=development
// (the default mode), so Enabled is true. For another mode set Enabled from
// DefaultEnabled.
func DefaultConfig() Config {
	return Config{
		Enabled:              DefaultEnabled("development"),
		Freshness:            300 * time.Second,
		SenderStaleThreshold: 600 * time.Second,
		MaxAttempts:          3,
		RefillPeriod:         60 * time.Second,
	}
}

// ErrInvalidConfig is returned (wrapped) by Config.Validate and New when a knob
// is out of range; the message names the environment variable.
var ErrInvalidConfig = errors.New("invalid self-heal config")

// maxAttemptsLimit keeps bucket arithmetic exact in float64 and the knob sane.
const maxAttemptsLimit = 1_000_000

// Validate checks every knob, whether or not self-heal is enabled (the
// freshness window is used by route_state either way). The error wraps
// ErrInvalidConfig and names the variable.
func (c Config) Validate() error {
	switch {
	case c.Freshness <= 0:
		return fmt.Errorf("%w: MARCONI_SELFHEAL_FRESHNESS_SECONDS must be positive, got %v", ErrInvalidConfig, c.Freshness)
	case c.SenderStaleThreshold <= 0:
		return fmt.Errorf("%w: MARCONI_SELFHEAL_SENDER_STALE_THRESHOLD_SECONDS must be positive, got %v", ErrInvalidConfig, c.SenderStaleThreshold)
	case c.MaxAttempts < 1 || c.MaxAttempts > maxAttemptsLimit:
		return fmt.Errorf("%w: MARCONI_SELFHEAL_MAX_ATTEMPTS_PER_SESSION must be between 1 and %d, got %d", ErrInvalidConfig, maxAttemptsLimit, c.MaxAttempts)
	case c.RefillPeriod <= 0:
		return fmt.Errorf("%w: MARCONI_SELFHEAL_TOKEN_REFILL_SECONDS must be positive, got %v", ErrInvalidConfig, c.RefillPeriod)
	}
	return nil
}
