package selfheal

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Outcome is the result of one side's evaluation, exactly the SPEC-168 AC-8
// enum (null is the empty string).
type Outcome string

// Outcomes of one side's evaluation. They are also the only label values of
// marconi_route_self_healed_total.
const (
	// OutcomeAttempted: the side has no queue but recent proof of life; the
	// hint (*_route_stale: true) is set and a token was spent.
	OutcomeAttempted Outcome = "attempted"
	// OutcomeSucceeded is reserved for a future server-observed reconnect.
	OutcomeSucceeded Outcome = "succeeded"
	// OutcomeNoListener is reserved for a future confirmation that no live
	// WebSocket handler exists.
	OutcomeNoListener Outcome = "no_listener"
	// OutcomeRateLimited: the side's token bucket is empty; no hint is set.
	OutcomeRateLimited Outcome = "rate_limited"
	// OutcomeStaleRecency: the side's freshest proof of life is too old; it is
	// treated as genuinely offline and no hint is set.
	OutcomeStaleRecency Outcome = "stale_recency"
	// OutcomeUnsupportedSurface: the recipient's surface has no persistent
	// WebSocket (codex, piggyback only); no hint is set.
	OutcomeUnsupportedSurface Outcome = "unsupported_surface"
	// OutcomeFailed is reserved for a future transient error in detection.
	OutcomeFailed Outcome = "failed"
)

// AllOutcomes returns the outcome enum in its documented order. It returns a
// fresh slice each call, so callers may keep or change it.
func AllOutcomes() []Outcome {
	return []Outcome{
		OutcomeAttempted,
		OutcomeSucceeded,
		OutcomeNoListener,
		OutcomeRateLimited,
		OutcomeStaleRecency,
		OutcomeUnsupportedSurface,
		OutcomeFailed,
	}
}

// Side is a side of a send that is evaluated; each has its own token buckets.
type Side string

// Sides of a send.
const (
	SideRecipient Side = "recipient"
	SideSender    Side = "sender"
)

// Surface is what kind of agent a session is (the surface field of a
// registration). Whether it keeps a persistent WebSocket decides the
// self-heal surface gate.
type Surface string

// Surfaces of the contract. A console is SurfaceConsolePrefix followed by a
// name of 1 to 64 characters [A-Za-z0-9._-].
const (
	SurfaceClaudeCode    Surface = "claude_code"
	SurfaceHeadlessCC    Surface = "headless_cc"
	SurfaceHeadlessCX    Surface = "headless_cx"
	SurfaceCodex         Surface = "codex"
	SurfaceConsolePrefix         = "console_"
)

var consoleName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// SurfaceNames lists the contract's surfaces for messages, in the order of
// docs/api.md.
const SurfaceNames = string(SurfaceClaudeCode) + ", " + SurfaceConsolePrefix + "<name>, " +
	string(SurfaceHeadlessCC) + ", " + string(SurfaceHeadlessCX) + ", " + string(SurfaceCodex)

// Valid reports whether s is one of the contract's surfaces.
func (s Surface) Valid() bool {
	switch s {
	case SurfaceClaudeCode, SurfaceHeadlessCC, SurfaceHeadlessCX, SurfaceCodex:
		return true
	}
	name, ok := strings.CutPrefix(string(s), SurfaceConsolePrefix)
	return ok && consoleName.MatchString(name)
}

// Live reports whether s keeps a persistent WebSocket and so can be healed by
// a reconnect: claude_code, headless_cc, headless_cx and console_<name> with
// a non-empty name. codex (piggyback only) and anything else are not live.
func (s Surface) Live() bool {
	switch s {
	case SurfaceClaudeCode, SurfaceHeadlessCC, SurfaceHeadlessCX:
		return true
	}
	name, ok := strings.CutPrefix(string(s), SurfaceConsolePrefix)
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

// Defaults of the Config knobs, each set here only.
const (
	DefaultFreshness            = 300 * time.Second
	DefaultSenderStaleThreshold = 600 * time.Second
	DefaultMaxAttempts          = 3
	DefaultRefillPeriod         = 60 * time.Second
)

// DefaultConfig returns the documented defaults for MARCONI_MODE=development
// (the default mode), so Enabled is true. For another mode set Enabled from
// DefaultEnabled.
func DefaultConfig() Config {
	return Config{
		Enabled:              DefaultEnabled("development"),
		Freshness:            DefaultFreshness,
		SenderStaleThreshold: DefaultSenderStaleThreshold,
		MaxAttempts:          DefaultMaxAttempts,
		RefillPeriod:         DefaultRefillPeriod,
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
