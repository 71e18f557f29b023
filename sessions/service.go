package sessions

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/internal/ratelimit"
	"github.com/marconihub/marconi/sessionstore"
)

// Store is the part of the session registry the service uses;
// sessionstore.Store meets it, and each method returns the errors documented
// there.
type Store interface {
	CreateSession(ctx context.Context, s sessionstore.Session, now time.Time) (sessionstore.Session, error)
	ResumeSession(ctx context.Context, k sessionstore.Key, oldHash, newHash []byte, t sessionstore.Touch, now time.Time) (sessionstore.Session, error)
	RetryRegistration(ctx context.Context, k sessionstore.Key, keyHash, apiKeyHash []byte, since time.Time, newHash []byte, t sessionstore.Touch, now time.Time) (sessionstore.Session, error)
	SpendRegistrationKey(ctx context.Context, k sessionstore.Key, tokenHash []byte) error
	GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error)
	CountSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) (int, error)
	TouchSessionAs(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, t sessionstore.Touch, now time.Time) error
	DeleteSession(ctx context.Context, k sessionstore.Key) error
}

// Placer is what registration needs of the fabric's placement: the
// instance of a new sticky session (fabric.Placer meets it).
type Placer interface {
	Assign(ctx context.Context, tenantID, projectID string) (string, error)
}

// Classifier is what registration needs of the fabric's adaptive canary:
// the runtime mode of a new session, and the count of its own placements
// (fabric.Canary meets it).
type Classifier interface {
	RuntimeMode(explicit fabric.Mode, clientID string, h fabric.Hints) (fabric.Mode, fabric.ModeSource)
	CountAdaptivePlacement(ctx context.Context)
}

// Revoker is told when a session token stops working, so that nothing it
// opened keeps working: the hub drops it from its token cache and closes the
// WebSockets opened with it. Its methods are best effort and return nothing.
type Revoker interface {
	// Replaced: sess (the row after the change) holds a new token; the
	// token hashed oldHash (nil when unknown) no longer works.
	Replaced(ctx context.Context, sess sessionstore.Session, oldHash []byte)
	// Ended: sess (the row before the change) was deregistered.
	Ended(ctx context.Context, sess sessionstore.Session)
}

// Config is the service's configuration. New fills the zero fields that
// have a default (WithDefaults); SessionTTL is required.
type Config struct {
	// SessionTTL: a session expires this long after its freshest proof of life.
	SessionTTL time.Duration
	// QuotaSessionsPerProject caps the live sessions of one project.
	QuotaSessionsPerProject int
	// QuotaRegistrationsPerSecond is the registration rate per API key, in
	// this instance's memory; the burst is twice it.
	QuotaRegistrationsPerSecond float64
	// RetryWindow is MARCONI_REGISTRATION_RETRY_SECONDS: how long after a
	// registration its Idempotency-Key still retries it (unless the token
	// it made was used first).
	RetryWindow time.Duration
	// AllowTakeover is MARCONI_ALLOW_TAKEOVER: a registration with
	// takeover true and an API key of the session's project resumes a live
	// session without its token.
	AllowTakeover bool
}

// Defaults of Config's zero fields, each set here only (hub.Config names
// them for cmd/marconi).
const (
	DefaultQuotaSessionsPerProject     = 20000
	DefaultQuotaRegistrationsPerSecond = 50
	DefaultRetryWindow                 = 5 * time.Minute
)

// WithDefaults returns c with each zero field that has a default set to it.
func (c Config) WithDefaults() Config {
	c.QuotaSessionsPerProject = cmp.Or(c.QuotaSessionsPerProject, DefaultQuotaSessionsPerProject)
	c.QuotaRegistrationsPerSecond = cmp.Or(c.QuotaRegistrationsPerSecond, DefaultQuotaRegistrationsPerSecond)
	c.RetryWindow = cmp.Or(c.RetryWindow, DefaultRetryWindow)
	return c
}

func (c Config) validate() error {
	if c.SessionTTL <= 0 || c.QuotaSessionsPerProject <= 0 || c.QuotaRegistrationsPerSecond <= 0 || c.RetryWindow <= 0 {
		return errors.New("sessions: session TTL, quotas and retry window must be positive")
	}
	return nil
}

// Deps are the service's collaborators. Store, Placer and Classifier are
// required.
type Deps struct {
	Store      Store
	Placer     Placer
	Classifier Classifier
	// Revoker is told of tokens that stop working; nil tells nobody.
	Revoker  Revoker
	Registry prometheus.Registerer
	Logger   *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Service registers, resumes, takes over, heartbeats and deregisters
// sessions. It is safe for concurrent use.
type Service struct {
	cfg     Config
	store   Store
	placer  Placer
	classes Classifier
	revoker Revoker
	log     *slog.Logger
	now     func() time.Time
	metrics *metrics

	// registrations is the per-API-key registration quota; newSessions
	// serialises the count-then-create of one project's new sessions.
	registrations *ratelimit.Limiter[[32]byte]
	newSessions   *keyedMutex[Project]
	rooms         *projectRooms
}

// New builds a Service and registers its metrics on d.Registry.
func New(cfg Config, d Deps) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if d.Store == nil || d.Placer == nil || d.Classifier == nil || d.Registry == nil {
		return nil, errors.New("sessions: a store, a placer, a classifier and a registry are required")
	}
	if d.Revoker == nil {
		d.Revoker = noRevoker{}
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	m, err := newMetrics(d.Registry)
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg: cfg, store: d.Store, placer: d.Placer, classes: d.Classifier, revoker: d.Revoker, log: d.Logger, now: d.Now, metrics: m,
		registrations: ratelimit.New[[32]byte](cfg.QuotaRegistrationsPerSecond, d.Now),
		newSessions:   newKeyedMutex[Project](),
		rooms:         newProjectRooms(),
	}, nil
}

// Sweep forgets the quota state that has run out (refilled registration
// buckets, project counts past their recount); the hub runs it on a timer.
func (s *Service) Sweep() {
	s.registrations.Sweep()
	s.rooms.sweep(s.now())
}

type noRevoker struct{}

func (noRevoker) Replaced(context.Context, sessionstore.Session, []byte) {}
func (noRevoker) Ended(context.Context, sessionstore.Session)            {}

// TokenPrefix starts every session token, so that a credential of another
// kind is refused before any lookup.
const TokenPrefix = "mst_"

// NewToken returns a fresh session token: TokenPrefix and 32 random bytes,
// base64url.
func NewToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("sessions: crypto/rand failed: " + err.Error())
	}
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// HashToken is how a session token is stored and looked up: its SHA-256
// (a 256-bit random value needs no slow hash).
func HashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// keyAttrs is the structured-log group of a session key, as the hub logs it.
func keyAttrs(k sessionstore.Key) slog.Attr {
	return slog.Group("session", "tenant_id", k.TenantID, "project_id", k.ProjectID, "session_id", k.SessionID)
}
