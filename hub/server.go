package hub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub/conns"
	"github.com/marconihub/marconi/internal/fieldcheck"
	"github.com/marconihub/marconi/internal/ratelimit"
	"github.com/marconihub/marconi/sessions"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
	"github.com/marconihub/marconi/signals/selfheal"
	"github.com/marconihub/marconi/web"
)

// Config is the hub's configuration. cmd/marconi fills it from the
// environment; zero durations and sizes mean the documented defaults, and
// New refuses a value out of range, naming the field.
type Config struct {
	// Mode is development, lan or cloud.
	Mode marconi.DeploymentMode
	// InstanceID names this hub instance in the shared registry.
	InstanceID string
	// PublicURL is where clients reach this instance (sticky placement).
	PublicURL string
	// SessionTTL: a session expires this long after its freshest proof of life.
	SessionTTL time.Duration
	// HeartbeatInterval is what registration tells clients to heartbeat at.
	HeartbeatInterval time.Duration
	// TouchInterval bounds proof-of-life writes: at most one per session per interval.
	TouchInterval time.Duration
	// StoreTimeout bounds every store call made for a request (fail closed fast).
	StoreTimeout time.Duration
	// BodyReadTimeout bounds reading a request body, apart from the store
	// deadline: a body slower than this is refused with 408 request_timeout.
	BodyReadTimeout time.Duration
	// QuotaSessionsPerProject caps the live sessions of one project.
	QuotaSessionsPerProject int
	// QuotaRegistrationsPerSecond is the registration rate per API key, in
	// this instance's memory; the burst is twice it.
	QuotaRegistrationsPerSecond float64
	// MaxPayloadBytes limits a signal's encoded payload.
	MaxPayloadBytes int
	// SendRatePerSecond is the per-session send limit; the burst is twice it.
	SendRatePerSecond float64
	// QuotaAttachesPerSecond is MARCONI_QUOTA_ATTACHES_PER_SECOND (5): the
	// WebSocket attaches of one session on this instance, burst twice it;
	// past it an attach is refused with 429 before any store write.
	QuotaAttachesPerSecond float64
	// StoreQuotas are the quotas the store enforces inside each append
	// (pending signals per recipient, pending bytes per project); zero
	// fields take the signals package's defaults.
	StoreQuotas sessionstore.Limits
	// TokenCacheSize is how many session tokens the send path remembers
	// (for TouchInterval each); 0 takes the default 10000, negative turns
	// the cache off.
	TokenCacheSize int
	// ReadyzCache is how long one store probe answers /readyz
	// (MARCONI_READYZ_CACHE_MS): checks within it share the probe's verdict,
	// and a store failure met by any call drops a cached "ready" at once.
	// 0 takes the default DefaultReadyzCache; negative turns the cache off
	// (checks during a probe still share it).
	ReadyzCache time.Duration
	// WSPingInterval: the hub pings every interval and drops a peer whose
	// pong has not come within one more interval.
	WSPingInterval time.Duration
	// WSReadLimit is the largest frame the hub reads from a client.
	WSReadLimit int64
	// WSQueueSize bounds each connection's outgoing queue; overflow closes
	// the connection with 4429 (the signals stay durable).
	WSQueueSize int
	// WSWriteTimeout bounds one frame write.
	WSWriteTimeout time.Duration
	// WSAckInterval is MARCONI_WS_ACK_INTERVAL_MS (5): a connection's acks
	// are coalesced and written at most once per interval (and on close).
	WSAckInterval time.Duration
	// WSFramesPerSecond is MARCONI_WS_FRAMES_PER_SECOND (100): frames a client
	// may send per connection and second, burst twice it; past it 1008.
	WSFramesPerSecond float64
	// MaxConnections is MARCONI_MAX_CONNECTIONS (100000): WebSockets open on
	// this instance; past it an attach is refused with 429 quota_exceeded.
	MaxConnections int
	// MaxConnectionsPerAddress is MARCONI_MAX_CONNECTIONS_PER_ADDRESS
	// (25000): WebSockets open from one client address.
	MaxConnectionsPerAddress int
	// APIKeys maps API key to tenant/project, from MARCONI_API_KEYS.
	APIKeys map[string]TenantProject
	// AdminToken guards /v1/ops/*.
	AdminToken string
	// SelfHeal configures the SPEC-168 gates (zero: the defaults of Mode,
	// on only in development); its Freshness is also the
	// route-state freshness window.
	SelfHeal selfheal.Config
	// Fabric configures runtime modes, placement and instance health.
	Fabric fabric.Config
	// Retention configures the pruning loop.
	Retention Retention
	// PendingSweep is MARCONI_PENDING_SWEEP_SECONDS (5): how often every
	// queue attached here is checked against the store and woken when it
	// has signals left to write, so that a lost cross-instance wake-up
	// delays a signal by at most this long.
	PendingSweep time.Duration
	// ExpiryCheck is MARCONI_EXPIRY_CHECK_SECONDS (1): how often this
	// instance looks for WebSockets whose session's expiry has passed, and
	// closes them with 4410 once the store confirms it: the most such a
	// WebSocket outlives its session's expires_at (plus one store read).
	// The same loop follows the store's history (conns.Hub.FollowHistory).
	ExpiryCheck time.Duration
	// SelfhealHistoryBucket is the width of one bucket of the self-heal
	// history the dashboard reads (GET /v1/ops/selfheal/history); the
	// history keeps the last 20.
	SelfhealHistoryBucket time.Duration
	// RegistrationRetry is MARCONI_REGISTRATION_RETRY_SECONDS (300): how
	// long a registration's Idempotency-Key retries it, unless the token it
	// made is used first.
	RegistrationRetry time.Duration
	// NoTakeover is MARCONI_ALLOW_TAKEOVER=false: a registration with
	// "takeover": true of a live session is refused (403) as any other
	// registration of a live id without its token.
	NoTakeover bool
	// IdempotencyWindow is MARCONI_IDEMPOTENCY_WINDOW_SECONDS (86400): how
	// long a send's idempotency key is remembered (signals.Config).
	IdempotencyWindow time.Duration
	// RecipientCacheAge is MARCONI_RECIPIENT_CACHE_MS (1000; negative: off)
	// and RecipientCacheSize MARCONI_RECIPIENT_CACHE_SIZE (10000): how long,
	// and for how many recipients, a recipient read by a send serves the
	// next sends to it (signals.Config).
	RecipientCacheAge  time.Duration
	RecipientCacheSize int
	// Pprof is MARCONI_PPROF (off): serve Go's runtime profiles under
	// /debug/pprof/ to a request carrying the admin token.
	Pprof bool
}

// Retention is how long the store keeps what is done with.
type Retention struct {
	// Acked is MARCONI_RETAIN_ACKED_SECONDS (86400): acknowledged signals are
	// kept this long after they were made (it is also the floor of the
	// idempotency window, which counts from there too).
	Acked time.Duration
	// Expired is MARCONI_RETAIN_EXPIRED_SECONDS (3600): expired sessions and
	// their signals are kept this long after expiry, for operators.
	Expired time.Duration
	// Every is MARCONI_PRUNE_INTERVAL_SECONDS (60).
	Every time.Duration
}

// TenantProject names the owner of an API key.
type TenantProject struct {
	TenantID, ProjectID string
}

// Defaults of Config's zero fields. The hub's own are set here only; those
// of a field the hub hands to a package are that package's, named here for
// cmd/marconi (the send path's, self-heal's and the fabric's have no name
// here, but the store timeout, which the hub and the fabric share).
const (
	DefaultMode              = marconi.Development
	DefaultSessionTTL        = time.Hour
	DefaultHeartbeatInterval = 20 * time.Second
	DefaultTouchInterval     = 5 * time.Second
	// DefaultStoreTimeout is the fabric's, which a fabric used without
	// the hub has too: one bound for the store calls of both.
	DefaultStoreTimeout = fabric.DefaultStoreTimeout
	// DefaultBodyReadTimeout bounds reading a request body.
	DefaultBodyReadTimeout   = 10 * time.Second
	DefaultSendRatePerSecond = 200
	// DefaultQuotaAttachesPerSecond is the attach rate per session.
	DefaultQuotaAttachesPerSecond = 5
	DefaultRetainAcked            = 24 * time.Hour
	DefaultRetainExpired          = time.Hour
	DefaultPruneEvery             = time.Minute
	DefaultPendingSweep           = 5 * time.Second
	DefaultExpiryCheck            = time.Second
	DefaultHistoryBucket          = 30 * time.Second
	DefaultTokenCacheSize         = 10000
	// DefaultReadyzCache is half HAProxy's fall × inter (2 × 500 ms in
	// deploy/haproxy.cfg): a cut no call meets is still seen within two checks.
	DefaultReadyzCache = 500 * time.Millisecond

	// DefaultQuotaSessionsPerProject caps a project's live sessions.
	DefaultQuotaSessionsPerProject = sessions.DefaultQuotaSessionsPerProject
	// DefaultQuotaRegistrationsPerSecond is the registration rate per API key.
	DefaultQuotaRegistrationsPerSecond = sessions.DefaultQuotaRegistrationsPerSecond
	// DefaultRegistrationRetry is how long a registration's Idempotency-Key retries it.
	DefaultRegistrationRetry = sessions.DefaultRetryWindow

	DefaultWSPingInterval           = conns.DefaultPingInterval
	DefaultWSReadLimit              = conns.DefaultReadLimit
	DefaultWSQueueSize              = conns.DefaultQueueSize
	DefaultWSWriteTimeout           = conns.DefaultWriteTimeout
	DefaultWSAckInterval            = conns.DefaultAckInterval
	DefaultWSFramesPerSecond        = conns.DefaultFramesPerSecond
	DefaultMaxConnections           = conns.DefaultMaxConnections
	DefaultMaxConnectionsPerAddress = conns.DefaultMaxConnectionsPerAddress
)

// withDefaults returns c with each of the hub's own zero fields set to its
// default, and self-heal's filled for c.Mode. The fields the hub hands to
// conns and sessions stay as they are: those packages fill them.
func (c Config) withDefaults() Config {
	c.Mode = cmp.Or(c.Mode, DefaultMode)
	c.InstanceID = cmp.Or(c.InstanceID, "local")
	c.SessionTTL = cmp.Or(c.SessionTTL, DefaultSessionTTL)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.TouchInterval = cmp.Or(c.TouchInterval, DefaultTouchInterval)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, DefaultStoreTimeout)
	c.BodyReadTimeout = cmp.Or(c.BodyReadTimeout, DefaultBodyReadTimeout)
	c.SendRatePerSecond = cmp.Or(c.SendRatePerSecond, DefaultSendRatePerSecond)
	c.QuotaAttachesPerSecond = cmp.Or(c.QuotaAttachesPerSecond, DefaultQuotaAttachesPerSecond)
	c.TokenCacheSize = cmp.Or(c.TokenCacheSize, DefaultTokenCacheSize)
	c.ReadyzCache = cmp.Or(c.ReadyzCache, DefaultReadyzCache)
	c.Retention.Acked = cmp.Or(c.Retention.Acked, DefaultRetainAcked)
	c.Retention.Expired = cmp.Or(c.Retention.Expired, DefaultRetainExpired)
	c.Retention.Every = cmp.Or(c.Retention.Every, DefaultPruneEvery)
	c.PendingSweep = cmp.Or(c.PendingSweep, DefaultPendingSweep)
	c.ExpiryCheck = cmp.Or(c.ExpiryCheck, DefaultExpiryCheck)
	c.SelfhealHistoryBucket = cmp.Or(c.SelfhealHistoryBucket, DefaultHistoryBucket)
	c.SelfHeal = c.SelfHeal.WithDefaults(c.Mode)
	c.Fabric.InstanceID = c.InstanceID
	c.Fabric.PublicURL = c.PublicURL
	c.Fabric.StoreTimeout = cmp.Or(c.Fabric.StoreTimeout, c.StoreTimeout)
	return c
}

// validate checks the hub's own fields once their defaults are applied; the
// packages check theirs when the hub builds them.
func (c Config) validate() error {
	if !slices.Contains(marconi.DeploymentModes, c.Mode) {
		return fmt.Errorf("hub: Mode %q is not one of %v", c.Mode, marconi.DeploymentModes)
	}
	return fieldcheck.Check("hub", "positive", map[string]bool{
		"SessionTTL":             c.SessionTTL > 0,
		"HeartbeatInterval":      c.HeartbeatInterval > 0,
		"TouchInterval":          c.TouchInterval > 0,
		"StoreTimeout":           c.StoreTimeout > 0,
		"BodyReadTimeout":        c.BodyReadTimeout > 0,
		"SendRatePerSecond":      c.SendRatePerSecond > 0,
		"QuotaAttachesPerSecond": c.QuotaAttachesPerSecond > 0,
		"Retention":              c.Retention.Acked > 0 && c.Retention.Expired > 0 && c.Retention.Every > 0,
		"PendingSweep":           c.PendingSweep > 0,
		"ExpiryCheck":            c.ExpiryCheck > 0,
		"SelfhealHistoryBucket":  c.SelfhealHistoryBucket > 0,
	})
}

// Deps are the collaborators the hub is wired with.
type Deps struct {
	Store    sessionstore.Store
	Registry prometheus.Registerer
	Gatherer prometheus.Gatherer
	Logger   *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Bus carries wake-ups between instances sharing the store; nil means
	// none (a lone instance on the in-memory store).
	Bus fabric.Bus
	// Schema, when set, says whether the store's schema is the one this
	// binary needs: nil when it is, else a *SchemaMismatch that /readyz
	// reports. nil means the store has no schema to check (memory).
	Schema func(context.Context) error
	// BusKeys is the store's bus key (pgstore.Store), for the operator's
	// /v1/ops/bus_key routes; nil means none (the in-memory store).
	BusKeys BusKeys
}

// Server is one hub instance's HTTP server. It is safe for concurrent use.
type Server struct {
	cfg      Config
	store    sessionstore.Store
	log      *slog.Logger
	now      func() time.Time
	echo     *echo.Echo
	metrics  *metrics
	creds    *credentials
	limits   *sendLimiter
	tokens   *tokenCache // nil when off
	conns    *conns.Hub
	signals  *signals.Service
	selfheal *selfheal.Evaluator
	// peered is true when a bus joins this instance to others: only then do
	// send answers name the recipient's instance (one instance alone has no
	// cross-instance path to save, and its default public URL is a guess).
	peered bool
	fabric *fabric.Fabric
	// busKeys is nil without a bus key (the in-memory store).
	busKeys BusKeys

	cluster  *clusterGauges
	http     *httpMetrics
	history  *selfhealHistory // nil without a Gatherer
	sessions *sessions.Service
	quotas   *quotaMetrics
	// attaches is the per-session attach quota; heartbeatWrites lets one
	// heartbeat write per session through per TouchInterval.
	attaches        *ratelimit.Limiter[sessionstore.Key]
	heartbeatWrites *pacer[sessionstore.Key]

	draining      atomic.Bool
	storeNotReady atomic.Bool                // set while the store's schema is not migrated
	storeCause    atomic.Pointer[storeCause] // why the store is not ready, when known
	ready         *readyCache                // the store's last verdict for /readyz

	// schema is Deps.Schema (nil: nothing to check); schemaOff is its last
	// mismatch, nil when the schema matched or was not read (a slow store
	// is not an unready one).
	schema    func(context.Context) error
	schemaOff atomic.Pointer[SchemaMismatch]
}

// New builds a hub. It does not listen; serve Handler() or use Start.
func New(cfg Config, d Deps) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if d.Store == nil {
		return nil, errors.New("hub: no store")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Registry == nil {
		r := prometheus.NewRegistry()
		d.Registry, d.Gatherer = r, r
	}
	m, err := newMetrics(d.Registry)
	if err != nil {
		return nil, err
	}
	qm, err := newQuotaMetrics(d.Registry)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		store:   d.Store,
		schema:  d.Schema,
		log:     d.Logger,
		now:     d.Now,
		metrics: m,
		creds:   newCredentials(cfg.APIKeys, cfg.AdminToken),
		limits:  newSendLimiter(cfg.SendRatePerSecond, d.Now),
		tokens:  newTokenCache(cfg.TokenCacheSize, cfg.TouchInterval),
		quotas:  qm,
		busKeys: d.BusKeys,

		attaches:        ratelimit.New[sessionstore.Key](cfg.QuotaAttachesPerSecond, d.Now),
		heartbeatWrites: newPacer[sessionstore.Key](cfg.TouchInterval),
	}
	w, _ := d.Store.(witness)
	s.ready = newReadyCache(cfg.ReadyzCache, d.Now, w)
	s.selfheal, err = selfheal.New(cfg.SelfHeal, d.Now, d.Registry, d.Logger)
	if err != nil {
		return nil, err
	}
	s.peered = d.Bus != nil
	if d.Bus == nil {
		d.Bus = fabric.NoBus{}
	}
	prober, _ := d.Bus.(fabric.Prober) // pgstore.Bus: death seen through the listener's connection
	fd := fabric.Deps{Store: d.Store, Prober: prober, Now: d.Now, Registry: d.Registry, Logger: d.Logger}
	if d.BusKeys != nil {
		// The first heartbeat, at start, reads the key if nothing has yet:
		// a live instance's row never shows its version as unknown.
		fd.BusKeyVersion = func(ctx context.Context) int64 { return d.BusKeys.LoadBusKey(ctx, d.Logger) }
	}
	s.fabric, err = fabric.New(cfg.Fabric, fd)
	if err != nil {
		return nil, err
	}
	s.cluster = &clusterGauges{reporter: s.fabric.Members.Reporter}
	if err := d.Registry.Register(s.cluster); err != nil {
		return nil, err
	}
	if s.http, err = newHTTPMetrics(d.Registry); err != nil {
		return nil, err
	}
	if d.Gatherer != nil {
		s.history = &selfhealHistory{gatherer: d.Gatherer, every: cfg.SelfhealHistoryBucket}
	}
	s.conns, err = conns.New(conns.Config{
		InstanceID:    cfg.InstanceID,
		StartedAt:     s.fabric.Members.StartedAt(),
		SessionTTL:    cfg.SessionTTL,
		TouchInterval: cfg.TouchInterval,
		StoreTimeout:  cfg.StoreTimeout,
		PingInterval:  cfg.WSPingInterval,
		ReadLimit:     cfg.WSReadLimit,
		QueueSize:     cfg.WSQueueSize,
		WriteTimeout:  cfg.WSWriteTimeout,
		AckInterval:   cfg.WSAckInterval,

		FramesPerSecond:          cfg.WSFramesPerSecond,
		MaxConnections:           cfg.MaxConnections,
		MaxConnectionsPerAddress: cfg.MaxConnectionsPerAddress,
		OnQuotaRefused:           s.QuotaRefused,
	}, conns.Deps{
		Store: d.Store,
		// s.signals is built after the connection hub: read it at the call.
		Ack: func(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upToSeq int64) (int, error) {
			return s.signals.AckAs(ctx, k, h, upToSeq)
		},
		Peers:    s.fabric.Members,
		Bus:      d.Bus,
		Draining: s.Draining,
		Registry: d.Registry,
		Logger:   d.Logger,
		Now:      d.Now,
	})
	if err != nil {
		return nil, err
	}
	s.signals, err = signals.New(signals.Config{
		MaxPayloadBytes:    cfg.MaxPayloadBytes,
		IdempotencyWindow:  cfg.IdempotencyWindow,
		RecipientCacheAge:  cfg.RecipientCacheAge,
		RecipientCacheSize: cfg.RecipientCacheSize,
		Freshness:          cfg.SelfHeal.Freshness,
		Quotas:             cfg.StoreQuotas,
	}, d.Store, s.conns, s.selfheal, d.Now, d.Registry, d.Logger)
	if err != nil {
		return nil, err
	}
	s.sessions, err = sessions.New(sessions.Config{
		SessionTTL:                  cfg.SessionTTL,
		QuotaSessionsPerProject:     cfg.QuotaSessionsPerProject,
		QuotaRegistrationsPerSecond: cfg.QuotaRegistrationsPerSecond,
		RetryWindow:                 cfg.RegistrationRetry,
		AllowTakeover:               !cfg.NoTakeover,
	}, sessions.Deps{Store: d.Store, Placer: s.fabric.Placer, Classifier: s.fabric.Canary, Revoker: revoker{s}, Registry: d.Registry, Logger: d.Logger, Now: d.Now})
	if err != nil {
		return nil, err
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorHandler
	s.echo = e
	s.routes(d.Gatherer)
	return s, nil
}

func (s *Server) routes(g prometheus.Gatherer) {
	e := s.echo
	e.Use(s.observeHTTP)
	getHead := []string{http.MethodGet, http.MethodHead}
	e.Match(getHead, "/healthz", s.healthz)
	e.Match(getHead, "/readyz", s.readyz)
	if g != nil {
		e.Match(getHead, "/metrics", echo.WrapHandler(promhttp.HandlerFor(g, promhttp.HandlerOpts{})))
	}

	// Every credential is checked before the body is read (withBody): a
	// request without one costs no body read (docs/security.md). Each
	// route's middleware is composed once, here (chain): echo composes a
	// route's or a group's again on every request, a closure each.
	v1 := func(method, path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) {
		e.Add(method, "/v1"+path, chain(h, append([]echo.MiddlewareFunc{s.storeDeadline}, m...)...))
	}
	v1(http.MethodPost, "/sessions", s.register, s.apiKeyAuth, s.withBody)
	v1(http.MethodPost, "/heartbeat", s.heartbeat, s.sessionAuth, s.withBody)
	v1(http.MethodDelete, "/session", s.deregister, s.sessionAuth, s.withBody)
	v1(http.MethodPost, "/signals", s.send, s.sendAuth, s.withBody, s.provesLife)
	v1(http.MethodGet, "/signals", s.drain, s.sessionAuth, s.withBody, s.provesLife)
	v1(http.MethodPost, "/signals/ack", s.ack, s.sessionAuth, s.withBody, s.provesLife)
	v1(http.MethodPost, "/placement-mismatch", s.placementMismatch, s.sessionAuth, s.withBody, s.provesLife)
	v1(http.MethodGet, "/ws", s.attach)

	ops := func(method, path string, h echo.HandlerFunc) {
		v1(method, "/ops"+path, h, s.adminAuth, s.withBody)
	}
	ops(http.MethodPost, "/api_keys", s.createAPIKey)
	ops(http.MethodPost, "/api_keys/revoke", s.revokeAPIKey)
	ops(http.MethodGet, "/route_state", s.routeStateList)
	ops(http.MethodGet, "/route_state/:tenant/:project/:session", s.routeStateOne)
	ops(http.MethodGet, "/fabric/summary", s.fabricSummary)
	ops(http.MethodGet, "/sessions/:tenant/:project/:session/signals", s.opsPending)
	ops(http.MethodPost, "/sessions/:tenant/:project/:session/disconnect", s.opsDisconnect)
	ops(http.MethodDelete, "/sessions/:tenant/:project/:session", s.opsDeregister)
	ops(http.MethodGet, "/selfheal/history", s.opsSelfhealHistory)
	ops(http.MethodGet, "/bus_key", s.opsBusKey)
	ops(http.MethodPost, "/bus_key/rotate", s.opsRotateBusKey)
	// Paths under /v1 and /v1/ops that name no route go through the same
	// middleware as their routes (a 404 only once the store is up and, for
	// /v1/ops, the admin token checked), as echo's groups would.
	for _, p := range []string{"", "/*"} {
		v1(echo.RouteNotFound, p, echo.NotFoundHandler)
		ops(echo.RouteNotFound, p, echo.NotFoundHandler)
	}

	if s.cfg.Pprof {
		dbg := e.Group("/debug/pprof", s.adminAuth)
		dbg.GET("/*", echo.WrapHandler(http.HandlerFunc(servePprof)))
	}

	// The operator dashboard: static files, no credential (the page asks for
	// the admin token and sends it on its own /v1/ops calls).
	dash := echo.WrapHandler(web.Handler())
	e.Match(getHead, "/*", func(c echo.Context) error {
		if strings.HasPrefix(c.Request().URL.Path, "/v1/") {
			return echo.ErrNotFound
		}
		return dash(c)
	})
}

// chain is h inside its middleware, m[0] outermost, as echo applies a
// route's middleware.
func chain(h echo.HandlerFunc, m ...echo.MiddlewareFunc) echo.HandlerFunc {
	for i := len(m) - 1; i >= 0; i-- {
		h = m[i](h)
	}
	return h
}

// Handler is the hub's http.Handler.
func (s *Server) Handler() http.Handler { return s.echo }

// InstanceID is this instance's id.
func (s *Server) InstanceID() string { return s.cfg.InstanceID }

// Fabric is this instance's part in the fabric (tests tick it to decide
// instance health without waiting).
func (s *Server) Fabric() *fabric.Fabric { return s.fabric }

// SetDraining marks the instance as draining: /readyz answers 503 and new
// work is refused with draining. It is the first step of shutdown.
// The store is told at once, so other instances stop routing here now.
func (s *Server) SetDraining() {
	s.draining.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StoreTimeout)
	defer cancel()
	if err := s.fabric.Members.SetDraining(ctx); err != nil {
		s.log.Warn("mark draining in the store", "err", err)
	}
}

// SetStoreReady says whether the store can serve (its schema is migrated).
// A hub starts ready; cmd/marconi marks it not ready until migrations apply.
// Not ready, every store-backed call answers 503 registry_unavailable and
// /readyz fails.
// Marked ready after migrations this binary applied, the schema is its own:
// a schema mismatch seen before is forgotten.
func (s *Server) SetStoreReady(ready bool) {
	if ready {
		s.schemaOff.Store(nil)
	}
	s.storeNotReady.Store(!ready)
}

// SetStoreCause says why the store is not ready: public for anyone who can
// reach the hub ("connection refused", "schema migrations failing"), detail
// for an operator, with the database's address ("connection refused at
// db:5432"). The 503 answers name the public cause; /readyz names the detail
// to a request carrying the admin token. An empty public cause means
// "migrations pending".
func (s *Server) SetStoreCause(public, detail string) {
	s.storeCause.Store(&storeCause{public: public, detail: detail})
}

// storeCause is what SetStoreCause was told.
type storeCause struct{ public, detail string }

// notReadyMessage is the message of a 503 while the store is not ready;
// detail names the cause as an operator needs it.
func (s *Server) notReadyMessage(detail bool) string {
	cause := "schema migrations pending"
	if p := s.storeCause.Load(); p != nil && p.public != "" {
		cause = p.public
		if detail && p.detail != "" {
			cause = p.detail
		}
	}
	return "the session registry is not ready (" + cause + ")"
}

// storeDiagnoser is met by a store that can say why a call failed
// (pgstore.Store, breaker.Store): Diagnose for an operator, naming the
// database's address, user or name; Classify for anyone, naming none.
type storeDiagnoser interface {
	Diagnose(error) string
	Classify(error) string
}

// readiness is met by a store that knows better than a ping whether
// sending traffic here helps (breaker.Store: not while the store is merely
// slow); /readyz asks it instead of pinging.
type readiness interface{ Ready(context.Context) error }

// reachability is met by a store that can tell "gone" from "slow" better
// than a ping (pgstore.Store without the breaker: Postgres answers even
// while every pooled connection is busy).
type reachability interface{ Reachable(context.Context) error }

// Draining reports whether SetDraining was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// CloseConnections is the WebSocket step of shutdown: it refuses new
// attaches, closes every attached connection with 1012 (hub restarting) and
// waits, until ctx ends, for their handlers to finish.
func (s *Server) CloseConnections(ctx context.Context) error { return s.conns.Close(ctx) }

// WakeLocal hands this instance a cross-instance wake-up, as its bus
// listener does: the session's queue pushes the carried signal, or catches
// up from the store.
func (s *Server) WakeLocal(w sessionstore.Wake) { s.conns.WakeLocal(w) }

// Run runs the hub's background loops (pruning, bucket sweeps, the
// wake-up listener, the pending sweep and the expiry check) until ctx
// ends, and returns when they have all stopped.
func (s *Server) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.conns.Listen(ctx) })
	g.Go(func() error { s.every(ctx, s.cfg.PendingSweep, s.conns.Sweep); return nil })
	g.Go(func() error {
		s.every(ctx, s.cfg.ExpiryCheck, func(ctx context.Context) {
			s.conns.FollowHistory()
			s.conns.CloseExpired(ctx)
		})
		return nil
	})
	if s.history != nil {
		g.Go(func() error {
			start := s.now()
			s.every(ctx, s.history.every, func(context.Context) {
				_ = s.history.sample(start)
				start = s.now()
			})
			return nil
		})
	}
	g.Go(func() error {
		s.sampleClusterNow(ctx) // exported from the start, not after the first prune
		s.every(ctx, s.cfg.Retention.Every, s.prune)
		return nil
	})
	if s.schema != nil {
		g.Go(func() error { s.watchSchema(ctx); return nil })
	}
	g.Go(func() error { return s.fabric.Run(ctx) })
	g.Go(func() error {
		s.every(ctx, 30*time.Second, func(context.Context) {
			s.selfheal.Sweep()
			s.limits.Sweep()
			s.sessions.Sweep()
			s.attaches.Sweep()
			s.heartbeatWrites.sweep(s.now())
		})
		return nil
	})
	return g.Wait()
}

// every runs fn each period until ctx ends.
func (s *Server) every(ctx context.Context, period time.Duration, fn func(context.Context)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}

// prune applies the retention policy once, then samples the cluster-wide
// gauges (clustermetrics.go).
func (s *Server) prune(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	now := s.now()
	sigs, sessions, err := s.store.Prune(ctx, now.Add(-s.cfg.Retention.Acked), now.Add(-s.cfg.Retention.Expired))
	// A prune cut short by its deadline still removed what it counted.
	s.metrics.pruned.WithLabelValues("signals").Add(float64(sigs))
	s.metrics.pruned.WithLabelValues("sessions").Add(float64(sessions))
	if err != nil {
		s.log.Warn("prune (what it removed is counted; the rest goes next run)", "signals", sigs, "sessions", sessions, "err", err)
		return
	}
	if sigs+sessions > 0 {
		s.log.Debug("pruned", "signals", sigs, "sessions", sessions)
	}
	s.sampleCluster(ctx)
}

// Shutdown stops accepting work, closes WebSockets and the HTTP server.
// Background loops are the caller's (Run's context).
func (s *Server) Shutdown(ctx context.Context) error {
	s.SetDraining()
	err := s.CloseConnections(ctx)
	return errors.Join(err, s.echo.Shutdown(ctx))
}

// storeDeadline bounds the store calls of ordinary requests so that an
// unreachable store answers 503 quickly instead of hanging. The body is read
// after the credential is checked, on its own bound (withBody), which then
// gives the handler's store calls a deadline of their own.
func (s *Server) storeDeadline(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.storeNotReady.Load() {
			return refuseUnread(c, marconi.Errorf(marconi.CodeRegistryUnavailable, "%s; try again shortly", s.notReadyMessage(false)))
		}
		if sm := s.schemaOff.Load(); sm != nil && sm.Refuse {
			return refuseUnread(c, marconi.Errorf(marconi.CodeRegistryUnavailable, "%s; try again shortly", s.schemaMismatch(false)))
		}
		if c.Path() == "/v1/ws" {
			return next(c)
		}
		d := &requestState{base: c.Request().Context(), timeout: s.cfg.StoreTimeout}
		defer d.stop()
		d.arm(c)
		return refuseUnread(c, next(c))
	}
}

// requestState is what the hub keeps of one request under storeDeadline:
// the deadline of its store calls, which withBody arms again once the body
// is read so that the read does not spend it, and the caller sessionAuth
// or sendAuth authenticated. It rides in the request's context (the
// storeContext answers Value(requestStateKey{}) with it), so that a request
// costs no map of echo.Context values and no boxed session.
type requestState struct {
	base    context.Context
	timeout time.Duration
	ctx     *storeContext

	// caller is the authenticated session as it was before this call
	// (never changed: it may be the token cache's), and callerTokenHash
	// the SHA-256 of the token it presented; hasCaller reports whether a
	// session was authenticated.
	caller          *sessionstore.Session
	callerTokenHash [32]byte
	hasCaller       bool

	// body is the request's body once readBody has read it.
	body bufferedBody
	// first is the request's first storeContext (ctx, unless a later arm
	// had to make another).
	first storeContext
}

// requestStateKey is the context key of a request's *requestState.
type requestStateKey struct{}

// stateOf returns the request's state, or nil outside storeDeadline.
func stateOf(c echo.Context) *requestState {
	st, _ := c.Request().Context().Value(requestStateKey{}).(*requestState)
	return st
}

// arm gives c's request a fresh deadline, timeout from now: the one it
// carries moved, unless a store call has started its timer already.
func (d *requestState) arm(c echo.Context) {
	if d.ctx != nil && d.ctx.rearm(d.timeout) {
		return
	}
	d.stop()
	if d.ctx == nil {
		// The first one lives in d: one allocation less per request.
		d.first = storeContext{parent: d.base, deadline: time.Now().Add(d.timeout)}
		d.ctx = &d.first
	} else {
		d.ctx = newStoreContext(d.base, d.timeout)
	}
	d.ctx.state = d
	c.SetRequest(c.Request().WithContext(d.ctx))
}

// stop releases the deadline's timer, if one was made.
func (d *requestState) stop() {
	if d.ctx != nil {
		d.ctx.release()
	}
}

// withBody reads the request body (readBody) once its credential has been
// checked, and arms the store deadline anew for the handler.
func (s *Server) withBody(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := s.readBody(c); err != nil {
			return err
		}
		if d := stateOf(c); d != nil {
			d.arm(c)
		}
		return next(c)
	}
}

// refuseUnread returns err, first asking net/http to close the connection
// after the answer when err refuses a request whose body is unread: else,
// to reuse the connection, net/http would read what is left of the body
// before answering, and a client that never sends it would hold the answer.
func refuseUnread(c echo.Context, err error) error {
	if err == nil {
		return nil
	}
	req := c.Request()
	if _, read := req.Body.(*bufferedBody); !read && req.ContentLength != 0 && req.Body != nil && req.Body != http.NoBody {
		c.Response().Header().Set(echo.HeaderConnection, "close")
	}
	return err
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok", "instance_id": s.cfg.InstanceID})
}

// probeStore asks the store whether sending traffic here helps, for the
// /readyz checks that share it (readyCache): the breaker's verdict where
// there is one, else whether Postgres answers at all, else a ping. It runs
// to its own timeout whichever check started it, since others may wait on it.
func (s *Server) probeStore() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StoreTimeout)
	defer cancel()
	ping := s.store.Ping
	switch r := s.store.(type) {
	case readiness:
		ping = r.Ready
	case reachability:
		ping = r.Reachable
	}
	err := ping(ctx)
	if err != nil {
		s.storeLog(err)("readyz: store unreachable", "err", err)
	}
	return err
}

func (s *Server) readyz(c echo.Context) error {
	if s.Draining() {
		s.writeError(c, marconi.Errorf(marconi.CodeDraining, "this instance is draining"))
		return nil
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	// Who may read where the database is: the log and the banner, and a
	// request carrying the admin token; anyone else reads the class of
	// failure only (docs/security.md).
	admin := s.isAdmin(c)
	if s.storeNotReady.Load() {
		s.writeError(c, marconi.Errorf(marconi.CodeRegistryUnavailable, "%s", s.notReadyMessage(admin)))
		return nil
	}
	if err := s.ready.check(ctx, s.probeStore); err != nil {
		msg := "the session registry cannot be reached"
		if d, ok := s.store.(storeDiagnoser); ok {
			cause := d.Classify(err)
			if admin {
				cause = d.Diagnose(err)
			}
			if cause != "" {
				msg += " (" + cause + ")"
			}
		}
		s.writeError(c, marconi.Errorf(marconi.CodeRegistryUnavailable, "%s", msg))
		return nil
	}
	if msg := s.schemaMismatch(admin); msg != "" {
		return c.JSON(http.StatusServiceUnavailable, errorBody{Error: errorDetail{Code: "registry_unavailable", Message: msg}})
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready", "instance_id": s.cfg.InstanceID})
}
