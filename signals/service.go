package signals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals/selfheal"
)

// Config holds the send path's limits.
type Config struct {
	// MaxPayloadBytes is MARCONI_MAX_PAYLOAD_BYTES (65536): the largest
	// encoded payload of one signal.
	MaxPayloadBytes int
	// IdempotencyWindow is MARCONI_IDEMPOTENCY_WINDOW_SECONDS (86400): how
	// long a send's idempotency key is remembered.
	IdempotencyWindow time.Duration
	// Freshness is the route-state freshness window,
	// MARCONI_SELFHEAL_FRESHNESS_SECONDS (300), whether or not self-heal is on.
	Freshness time.Duration
	// PiggybackLimit is how many pending signals ride on a response (50).
	PiggybackLimit int
	// DrainLimit caps one drain page (500).
	DrainLimit int
	// Quotas are the store-side quotas every append carries to the store:
	// MARCONI_QUOTA_PENDING_PER_RECIPIENT (10000) and
	// MARCONI_QUOTA_PENDING_BYTES_PER_PROJECT (268435456). A refused send
	// stores nothing and answers 429 quota_exceeded.
	Quotas sessionstore.Limits
	// RecipientCacheAge is MARCONI_RECIPIENT_CACHE_MS (1000): how long a
	// recipient read by a send serves the next sends to it without another
	// read (the append still checks its registration, token and queue; its
	// proof of life may be this old). Negative turns the cache off.
	RecipientCacheAge time.Duration
	// RecipientCacheSize is MARCONI_RECIPIENT_CACHE_SIZE (10000): how many
	// recipients are kept at most.
	RecipientCacheSize int
}

// Defaults of Config.
const (
	DefaultMaxPayloadBytes             = 65536
	DefaultIdempotencyWindow           = 24 * time.Hour
	DefaultQuotaPendingPerRecipient    = 10000
	DefaultQuotaPendingBytesPerProject = 256 << 20
	DefaultRecipientCacheAge           = time.Second
	DefaultRecipientCacheSize          = 10000
)

// Store is what the send path uses of sessionstore.Store; the methods'
// contracts, and the errors they return, are documented there.
type Store interface {
	GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error)
	AppendSignal(ctx context.Context, s sessionstore.NewSignal, now time.Time) (sig sessionstore.Signal, duplicate bool, err error)
	PendingSignals(ctx context.Context, k sessionstore.Key, afterSeq int64, limit int) ([]sessionstore.Signal, error)
	AckSignals(ctx context.Context, k sessionstore.Key, upToSeq int64, at time.Time) (int, error)
	AckSignalsAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upToSeq int64, at time.Time) (int, error)
}

// WithDefaults returns c with each zero field set to its default; each
// default is applied here only.
func (c Config) WithDefaults() Config {
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.IdempotencyWindow == 0 {
		c.IdempotencyWindow = DefaultIdempotencyWindow
	}
	if c.Freshness == 0 {
		c.Freshness = selfheal.DefaultFreshness
	}
	if c.PiggybackLimit == 0 {
		c.PiggybackLimit = 50
	}
	if c.DrainLimit == 0 {
		c.DrainLimit = 500
	}
	if c.Quotas.PendingPerRecipient == 0 {
		c.Quotas.PendingPerRecipient = DefaultQuotaPendingPerRecipient
	}
	if c.Quotas.PendingBytesPerProject == 0 {
		c.Quotas.PendingBytesPerProject = DefaultQuotaPendingBytesPerProject
	}
	if c.RecipientCacheAge == 0 {
		c.RecipientCacheAge = DefaultRecipientCacheAge
	}
	if c.RecipientCacheSize == 0 {
		c.RecipientCacheSize = DefaultRecipientCacheSize
	}
	return c
}

// ErrInvalidConfig is returned (wrapped) by New for a Config field out of
// range; the message names the field.
var ErrInvalidConfig = errors.New("invalid send path config")

// validate checks c once its defaults are applied.
func (c Config) validate() error {
	switch {
	case c.MaxPayloadBytes < 0:
		return fmt.Errorf("%w: MaxPayloadBytes must be positive, got %d", ErrInvalidConfig, c.MaxPayloadBytes)
	case c.IdempotencyWindow < 0:
		return fmt.Errorf("%w: IdempotencyWindow must be positive, got %v", ErrInvalidConfig, c.IdempotencyWindow)
	case c.Freshness < 0:
		return fmt.Errorf("%w: Freshness must be positive, got %v", ErrInvalidConfig, c.Freshness)
	case c.PiggybackLimit < 0:
		return fmt.Errorf("%w: PiggybackLimit must be positive, got %d", ErrInvalidConfig, c.PiggybackLimit)
	case c.DrainLimit < 0:
		return fmt.Errorf("%w: DrainLimit must be positive, got %d", ErrInvalidConfig, c.DrainLimit)
	case c.RecipientCacheSize < 0:
		return fmt.Errorf("%w: RecipientCacheSize must be positive, got %d", ErrInvalidConfig, c.RecipientCacheSize)
	case c.Quotas.PendingPerRecipient < 0 || c.Quotas.PendingBytesPerProject < 0:
		return fmt.Errorf("%w: Quotas must not be negative, got %+v", ErrInvalidConfig, c.Quotas)
	}
	return nil
}

// Service is the send path. It is safe for concurrent use.
type Service struct {
	cfg      Config
	store    Store
	router   Router
	selfheal *selfheal.Evaluator
	now      func() time.Time
	log      *slog.Logger
	metrics  *metrics
	// recipients are recently read recipients (persist).
	recipients *recipients
	// hist is the store's history (History), nil when it keeps none.
	hist sessionstore.Historian
}

// New builds the send path. store, router, sh and now are required; sh may
// be disabled (its Config().Enabled false) but not nil. A Config field out
// of range is an error wrapping ErrInvalidConfig.
func New(cfg Config, store Store, router Router, sh *selfheal.Evaluator, now func() time.Time, reg prometheus.Registerer, log *slog.Logger) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if store == nil || router == nil || sh == nil || now == nil {
		return nil, errors.New("signals: store, router, self-heal evaluator and clock are required")
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	hist, _ := store.(sessionstore.Historian)
	return &Service{cfg: cfg, store: store, router: router, selfheal: sh, now: now, log: log, metrics: m,
		recipients: newRecipients(cfg.RecipientCacheAge, cfg.RecipientCacheSize), hist: hist}, nil
}

// Config returns the service's configuration with defaults applied.
func (s *Service) Config() Config { return s.cfg }

// SendRequest is one POST /v1/signals, already authenticated.
type SendRequest struct {
	// Sender is the caller's session as loaded before this call.
	Sender sessionstore.Session
	// SenderTokenHash, when set, is the hash of the token the sender
	// presented: the store stores the signal only while a live session of
	// the sender still holds it (a token cache relies on that); otherwise
	// Send answers session_expired.
	SenderTokenHash []byte
	To              string
	Kind            string
	Payload         json.RawMessage
	IdempotencyKey  string
}

// SendResult is the answer to a send.
type SendResult struct {
	Signal     sessionstore.Signal
	Delivery   marconi.Delivery
	RouteState marconi.RouteState
	Duplicate  bool
	SelfHeal   selfheal.Result
	// Pending are the sender's own unacknowledged signals when it has no
	// attached queue (piggyback drain); nil otherwise.
	Pending []sessionstore.Signal
	// History is the token of the store's history Pending was read under,
	// when it was read (History).
	History string
	// RecipientInstance is the instance holding the recipient's queue when it
	// is attached on a healthy instance (Route.Attached); empty otherwise.
	RecipientInstance string
}

// The forms of an id, [A-Za-z0-9._-]{1,128}, and of a kind,
// [A-Za-z0-9._:/-]{1,64}, checked a byte at a time (every send checks
// both; FuzzIDForms holds them to those regular expressions).
var idBytes, kindBytes = byteClass("._-"), byteClass("._:/-")

// byteClass is the set of ASCII letters, digits and the bytes of extra.
func byteClass(extra string) (set [256]bool) {
	for b := 'A'; b <= 'Z'; b++ {
		set[b], set[b+'a'-'A'] = true, true
	}
	for b := '0'; b <= '9'; b++ {
		set[b] = true
	}
	for i := 0; i < len(extra); i++ {
		set[extra[i]] = true
	}
	return set
}

// ofForm reports whether s is 1 to max bytes, each in set.
func ofForm(s string, set *[256]bool, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !set[s[i]] {
			return false
		}
	}
	return true
}

// validKind reports whether kind has the form of a signal's kind.
func validKind(kind string) bool { return ofForm(kind, &kindBytes, 64) }

// IDForm says, in a refusal's message, what a session id, a tenant and a
// project look like.
const IDForm = "[A-Za-z0-9._-]{1,128}, and not . or .."

// ValidSessionID reports whether id has the form of a session id (also
// that of a tenant or a project): IDForm. "." and ".." are refused because
// browsers and proxies normalise such path segments away, so no
// /v1/ops/.../{session} path could name them and an operator could neither
// see nor end such a session.
func ValidSessionID(id string) bool {
	return id != "." && id != ".." && ofForm(id, &idBytes, 128)
}

// ValidText reports whether s is text a store and a log can take as it is:
// valid UTF-8 of at most max bytes, with no NUL or other control character
// (Postgres refuses NUL in text; control characters forge log lines).
func ValidText(s string, max int) bool {
	if len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// MaxIdempotencyKeyBytes bounds an idempotency key.
const MaxIdempotencyKeyBytes = 256

// Send persists a signal, classifies its recipient's route, evaluates the
// self-heal gates and hands it to the recipient's queue. The signal is
// durable when Send returns without error.
func (s *Service) Send(ctx context.Context, req SendRequest) (SendResult, error) {
	start := s.now()
	if err := s.validate(&req); err != nil {
		return SendResult{}, err
	}
	recipient, rRoute, sig, dup, err := s.persist(ctx, &req, start)
	if err != nil {
		return SendResult{}, err
	}
	res := SendResult{Signal: sig, Delivery: sig.Delivery, RouteState: sig.RouteState, Duplicate: dup}
	if rRoute.Attached {
		res.RecipientInstance = rRoute.InstanceID
	}
	if dup {
		// The first send's answer; nothing new is stored, delivered or counted.
		s.metrics.duplicates.Inc()
		return s.piggyback(ctx, req.Sender, s.router.Route(ctx, req.Sender), res), nil
	}
	// Always offer the signal to the recipient's queue: an attach that raced
	// this send may have missed it in its replay.
	s.router.Deliver(ctx, recipient, sig)
	s.metrics.countSent(res.Delivery)

	sRoute := s.router.Route(ctx, req.Sender)
	res.SelfHeal = s.selfheal.SpendAt(start, party(recipient, rRoute), party(req.Sender, sRoute))
	res = s.piggyback(ctx, req.Sender, sRoute, res)
	s.metrics.sendSeconds.Observe(s.now().Sub(start).Seconds())
	return res, nil
}

// persist classifies the send's route from its recipient and appends the
// signal. The recipient is one read within RecipientCacheAge, whose
// registration, token and queue the append checks (NewSignal.Seen), or else
// read now; one that changed since it was read is read again.
func (s *Service) persist(ctx context.Context, req *SendRequest, start time.Time) (sessionstore.Session, Route, sessionstore.Signal, bool, error) {
	toKey := sessionstore.Key{TenantID: req.Sender.TenantID, ProjectID: req.Sender.ProjectID, SessionID: req.To}
	// A UUIDv7 (time-ordered): consecutive appends insert into the end of
	// the signals table's unique index on id, as into its primary key,
	// rather than each onto a random page of an index that grows with the
	// retention (a page read and, after every checkpoint, a full page in
	// the WAL per send once the index outgrows memory).
	id := uuid.Must(uuid.NewV7()).String()
	recipient, seen, cached := s.recipients.get(toKey, start)
	for {
		if !cached {
			s.metrics.recipientMiss.Inc()
			var err error
			recipient, err = s.store.GetSession(ctx, toKey, start)
			if errors.Is(err, sessionstore.ErrNotFound) {
				s.recipients.drop(toKey)
				return recipient, Route{}, sessionstore.Signal{}, false, notRegistered(req.To)
			}
			if err != nil {
				return recipient, Route{}, sessionstore.Signal{}, false, fmt.Errorf("load recipient: %w", err)
			}
			s.recipients.put(recipient, start)
		}
		rRoute := s.router.Route(ctx, recipient)
		state := Classify(recipient, rRoute, start, s.cfg.Freshness)
		ns := sessionstore.NewSignal{
			ID:               id,
			To:               toKey,
			FromSession:      req.Sender.SessionID,
			Kind:             req.Kind,
			Payload:          req.Payload,
			CreatedAt:        start,
			IdempotencyKey:   req.IdempotencyKey,
			IdempotencySince: start.Add(-s.cfg.IdempotencyWindow),
			Delivery:         DeliveryFor(state),
			RouteState:       state,
			Limits:           s.cfg.Quotas,
			SenderTokenHash:  req.SenderTokenHash,
		}
		if cached {
			ns.Seen = seen
		}
		sig, dup, err := s.store.AppendSignal(ctx, ns, start)
		switch {
		case err == nil:
			if cached {
				s.metrics.recipientHit.Inc()
			}
			return recipient, rRoute, sig, dup, nil
		case cached && errors.Is(err, sessionstore.ErrRecipientChanged):
			s.metrics.recipientChanged.Inc()
			s.recipients.drop(toKey)
			cached = false
			continue
		case errors.Is(err, sessionstore.ErrTokenMismatch):
			err = marconi.Errorf(marconi.CodeSessionExpired, "this session token matches no live session; register again")
		case errors.Is(err, sessionstore.ErrNotFound):
			s.recipients.drop(toKey)
			err = notRegistered(req.To)
		default:
			err = fmt.Errorf("append signal: %w", err)
		}
		return recipient, rRoute, sig, dup, err
	}
}

func notRegistered(to string) error {
	return marconi.Errorf(marconi.CodeRecipientNotRegistered, "no live session %q in this project", to)
}

// piggyback adds the sender's own pending signals when it has no queue. It
// is best effort: the signal is already durable, and failing the send now
// would make the client retry and store it twice. A failed read leaves
// pending empty; the signals come by the next heartbeat, drain or send.
func (s *Service) piggyback(ctx context.Context, sender sessionstore.Session, r Route, res SendResult) SendResult {
	if r.Attached {
		return res
	}
	history := s.History()
	p, err := s.Pending(ctx, sender.Key, 0, s.cfg.PiggybackLimit)
	if err != nil && ctx.Err() != nil {
		// The sender's request ended (its client went away): nobody is
		// left to read the answer, and nothing is wrong with the hub.
		s.log.Debug("piggyback: the send's request ended", "session_id", sender.SessionID, "err", err)
		return res
	}
	if err != nil {
		s.log.Warn("piggyback: reading the sender's pending signals", "session_id", sender.SessionID, "err", err)
		return res
	}
	res.Pending, res.History = p, history
	return res
}

func party(sess sessionstore.Session, r Route) selfheal.Party {
	return selfheal.Party{
		TenantID: sess.TenantID, ProjectID: sess.ProjectID, SessionID: sess.SessionID,
		Surface: sess.Surface, ProofOfLife: sess.FreshestProofOfLife(), HasQueue: r.Attached,
	}
}

func (s *Service) validate(req *SendRequest) error {
	if req.To == "" {
		return marconi.Errorf(marconi.CodeInvalidField, "to_session is required")
	}
	if !ValidSessionID(req.To) {
		return marconi.Errorf(marconi.CodeInvalidField, "to_session must match %s", IDForm)
	}
	if req.Kind == "" {
		req.Kind = "signal"
	}
	if !validKind(req.Kind) {
		return marconi.Errorf(marconi.CodeInvalidField, "kind must match [A-Za-z0-9._:/-]{1,64}")
	}
	if len(req.Payload) == 0 {
		req.Payload = json.RawMessage("null")
	}
	if !utf8.Valid(req.Payload) {
		return marconi.Errorf(marconi.CodeInvalidField, "payload must be UTF-8 JSON")
	}
	if len(req.Payload) > s.cfg.MaxPayloadBytes {
		return marconi.Errorf(marconi.CodePayloadTooLarge, "payload is %d bytes encoded; the limit is %d", len(req.Payload), s.cfg.MaxPayloadBytes)
	}
	if !ValidText(req.IdempotencyKey, MaxIdempotencyKeyBytes) {
		return marconi.Errorf(marconi.CodeInvalidField, "idempotency_key must be UTF-8 text of at most %d bytes without control characters", MaxIdempotencyKeyBytes)
	}
	return nil
}

// Pending returns k's unacknowledged signals after afterSeq, oldest first, at
// most limit (capped by DrainLimit).
func (s *Service) Pending(ctx context.Context, k sessionstore.Key, afterSeq int64, limit int) ([]sessionstore.Signal, error) {
	if limit <= 0 || limit > s.cfg.DrainLimit {
		limit = s.cfg.DrainLimit
	}
	sigs, err := s.store.PendingSignals(ctx, k, afterSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("pending signals: %w", err)
	}
	return sigs, nil
}

// Ack acknowledges every signal of k with seq <= upToSeq.
func (s *Service) Ack(ctx context.Context, k sessionstore.Key, upToSeq int64) (int, error) {
	n, err := s.store.AckSignals(ctx, k, upToSeq, s.now())
	if err != nil {
		return 0, fmt.Errorf("ack signals: %w", err)
	}
	s.metrics.acked.Add(float64(n))
	return n, nil
}

// AckAs acknowledges every signal of k with seq <= upToSeq while h still
// speaks for k, checked in the same store write: it returns an error
// wrapping sessionstore.ErrNotFound when k is gone or registered again,
// sessionstore.ErrTokenMismatch when k holds another token, and
// sessionstore.ErrConflict when k changed meanwhile; nothing is
// acknowledged then.
func (s *Service) AckAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upToSeq int64) (int, error) {
	n, err := s.store.AckSignalsAs(ctx, k, h, upToSeq, s.now())
	if err != nil {
		return 0, fmt.Errorf("ack signals: %w", err)
	}
	s.metrics.acked.Add(float64(n))
	return n, nil
}
