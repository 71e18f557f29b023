package selfheal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
)

// MetricName is the counter of evaluated sides, labelled by outcome.
const MetricName = "marconi_route_self_healed_total"

// Party is one side of a send as the caller sees it before the send is
// recorded.
type Party struct {
	TenantID  string
	ProjectID string
	SessionID string
	Surface   Surface
	// ProofOfLife is the freshest proof of life BEFORE this call,
	// max(last_seen_at, last_verb_at, registered_at); the caller computes it
	// (sessionstore.Session.FreshestProofOfLife). A zero time is stale.
	ProofOfLife time.Time
	// HasQueue says that a WebSocket queue is attached on a healthy instance;
	// a side with a queue is not evaluated.
	HasQueue bool
}

// Result is the self-heal part of a send response. Every string is an outcome
// constant or "" (null on the wire).
type Result struct {
	// Recipient is the recipient side's outcome, "" when not evaluated.
	Recipient Outcome
	// Sender is the sender side's outcome, "" when not evaluated.
	Sender Outcome
	// RecipientRouteStale is set only with Recipient == marconi.OutcomeAttempted.
	RecipientRouteStale bool
	// SenderRouteStale is set only with Sender == marconi.OutcomeAttempted.
	SenderRouteStale bool
	// Outcome is selfheal_outcome: attempted when either side attempted, else
	// Recipient when evaluated, else Sender, else "".
	Outcome Outcome
}

type bucketKey struct {
	side                     Side
	tenant, project, session string
}

// bucket is a token bucket as of time at. A bucket that is not in the map
// is full.
type bucket struct {
	tokens float64
	at     time.Time
}

// Evaluator runs the SPEC-168 gates and owns the token buckets. It is safe for
// concurrent use. Its memory holds only buckets that are not full: the owner
// calls Sweep periodically (the hub does, every 30 s) so that
// buckets of sessions that went quiet are forgotten.
type Evaluator struct {
	cfg      Config
	now      func() time.Time
	log      *slog.Logger
	counters map[Outcome]prometheus.Counter

	mu      sync.Mutex
	buckets map[bucketKey]bucket
}

// New validates cfg and registers marconi_route_self_healed_total on reg with
// every outcome present at 0. now is the clock (nil: time.Now); logger gets a
// debug line per decision (nil: discarded). It returns an error wrapping
// ErrInvalidConfig for a bad cfg, or the registration error (for instance
// prometheus.AlreadyRegisteredError when reg already has the metric).
func New(cfg Config, now func() time.Time, reg prometheus.Registerer, logger *slog.Logger) (*Evaluator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if reg == nil {
		return nil, errors.New("selfheal: nil prometheus.Registerer")
	}
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricName,
		Help: "Self-heal (SPEC-168) evaluations of one side of a send, by outcome.",
	}, []string{"outcome"})
	if err := reg.Register(vec); err != nil {
		return nil, fmt.Errorf("selfheal: register %s: %w", MetricName, err)
	}
	counters := make(map[Outcome]prometheus.Counter, 7)
	for _, o := range marconi.Outcomes {
		counters[o] = vec.WithLabelValues(string(o))
	}
	return &Evaluator{
		cfg:      cfg,
		now:      now,
		log:      logger,
		counters: counters,
		buckets:  make(map[bucketKey]bucket),
	}, nil
}

// Config returns the configuration the Evaluator runs with.
func (e *Evaluator) Config() Config { return e.cfg }

// Spend runs the gates of docs/api.md "Self-heal hints" for one send and
// spends a token of each side whose outcome is attempted. The recipient side
// is evaluated only when the recipient has no queue; the sender side only
// when the sender has no queue and its surface is live. When self-heal is
// disabled it returns the zero Result, counts nothing and touches no bucket.
func (e *Evaluator) Spend(recipient, sender Party) Result {
	return e.SpendAt(e.now(), recipient, sender)
}

// SpendAt is Spend as of now: a caller that classified the route at
// now passes it, so the route state and the recency gates read one clock.
func (e *Evaluator) SpendAt(now time.Time, recipient, sender Party) Result {
	if !e.cfg.Enabled {
		return Result{}
	}
	var r Result
	e.mu.Lock()
	if !recipient.HasQueue {
		r.Recipient = e.gateLocked(now, SideRecipient, recipient, e.cfg.Freshness)
	}
	if !sender.HasQueue && sender.Surface.Live() {
		r.Sender = e.gateLocked(now, SideSender, sender, e.cfg.SenderStaleThreshold)
	}
	e.mu.Unlock()

	r.RecipientRouteStale = r.Recipient == marconi.OutcomeAttempted
	r.SenderRouteStale = r.Sender == marconi.OutcomeAttempted
	switch {
	case r.RecipientRouteStale || r.SenderRouteStale:
		r.Outcome = marconi.OutcomeAttempted
	case r.Recipient != "":
		r.Outcome = r.Recipient
	default:
		r.Outcome = r.Sender
	}
	if r.Recipient != "" {
		e.record(SideRecipient, recipient, r.Recipient)
	}
	if r.Sender != "" {
		e.record(SideSender, sender, r.Sender)
	}
	return r
}

// gateLocked decides one side: surface, recency, then the bucket. The caller
// holds e.mu. The sender's surface was checked by the caller, so the surface
// gate only ever answers for the recipient.
func (e *Evaluator) gateLocked(now time.Time, side Side, p Party, maxAge time.Duration) Outcome {
	if !p.Surface.Live() {
		return marconi.OutcomeUnsupportedSurface
	}
	if now.Sub(p.ProofOfLife) > maxAge {
		return marconi.OutcomeStaleRecency
	}
	k := bucketKey{side, p.TenantID, p.ProjectID, p.SessionID}
	tokens := e.tokensLocked(now, k)
	// The tolerance absorbs float rounding in the refill so that exactly one
	// refill interval always yields a whole token.
	if tokens < 1-1e-9 {
		e.buckets[k] = bucket{tokens: tokens, at: now}
		return marconi.OutcomeRateLimited
	}
	e.buckets[k] = bucket{tokens: max(tokens-1, 0), at: now}
	return marconi.OutcomeAttempted
}

// tokensLocked returns the tokens of k as of now and forgets k if it has
// refilled to full. The caller holds e.mu.
func (e *Evaluator) tokensLocked(now time.Time, k bucketKey) float64 {
	b, ok := e.buckets[k]
	if !ok {
		return float64(e.cfg.MaxAttempts)
	}
	t := e.refill(b, now)
	if t >= float64(e.cfg.MaxAttempts) {
		delete(e.buckets, k)
	}
	return t
}

// refill is b's token count at now: linear, MaxAttempts per RefillPeriod,
// capped at MaxAttempts. A clock that went backwards adds nothing.
func (e *Evaluator) refill(b bucket, now time.Time) float64 {
	capacity := float64(e.cfg.MaxAttempts)
	elapsed := now.Sub(b.at)
	if elapsed <= 0 {
		return b.tokens
	}
	t := b.tokens + float64(elapsed)*capacity/float64(e.cfg.RefillPeriod)
	return min(t, capacity)
}

func (e *Evaluator) record(side Side, p Party, outcome Outcome) {
	e.counters[outcome].Inc()
	if e.log.Enabled(context.Background(), slog.LevelDebug) {
		e.log.LogAttrs(context.Background(), slog.LevelDebug, "selfheal decision",
			slog.String("side", string(side)),
			slog.String("tenant_id", p.TenantID),
			slog.String("project_id", p.ProjectID),
			slog.String("session_id", p.SessionID),
			slog.String("surface", string(p.Surface)),
			slog.String("outcome", string(outcome)),
		)
	}
}

// Tokens is the number of tokens (fractional) left in a bucket now, for the
// operator route_state view; side is SideRecipient or SideSender. A bucket
// never used, or forgotten because it refilled, reads full (MaxAttempts).
func (e *Evaluator) Tokens(side Side, tenantID, projectID, sessionID string) float64 {
	now := e.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tokensLocked(now, bucketKey{side, tenantID, projectID, sessionID})
}

// Sweep forgets every bucket that has refilled to full, which behaves exactly
// like a bucket never used, and returns how many it dropped. The owner calls
// it periodically (the hub every RefillPeriod), so memory holds only the
// buckets that spent a token within the last RefillPeriod.
func (e *Evaluator) Sweep() int {
	now := e.now()
	capacity := float64(e.cfg.MaxAttempts)
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for k, b := range e.buckets {
		if e.refill(b, now) >= capacity {
			delete(e.buckets, k)
			n++
		}
	}
	return n
}

// Len is the number of buckets held in memory (not full), for tests and
// diagnostics.
func (e *Evaluator) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.buckets)
}
