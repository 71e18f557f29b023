package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Config says which hub and session the client talks to and what it calls
// back. HubURL, APIKey and Surface are required; every other field has a
// default.
type Config struct {
	HubURL string // any hub instance or a load balancer, e.g. http://127.0.0.1:8080
	// HubURLs are more hub instances (or balancers) to fail over to. The
	// client starts with HubURL (or, when HubURL is empty, the first of
	// HubURLs) and moves to the next URL, round the list, when the one it
	// uses is unreachable or answers 502, 503 draining or 504.
	HubURLs     []string
	APIKey      string
	SessionID   string // optional: empty lets the hub choose
	Surface     string // e.g. "claude_code"
	RuntimeMode string // "", "stateless" or "sticky"
	ClientID    string

	// OnSignal receives every signal addressed to the session: once per
	// signal id, in seq order, from one goroutine. The signal is acknowledged
	// after it returns, so it should return promptly: while it runs, no other
	// signal is delivered and the WebSocket stops being read. It may call
	// Send; it must not call Close. Nil drops (and acknowledges) signals.
	OnSignal func(Signal)
	// OnAffinityReset is called (from the same goroutine as OnSignal, before
	// any signal replayed on the new attachment) when the session's
	// runtime-local state is gone: the hub said affinity_reset in a welcome,
	// or the client had to register the session again (the hub no longer
	// knew it: TTL, deregistration, a store that lost it). Rehydrate it.
	OnAffinityReset func()
	// DeferAck leaves acknowledging to the application: a signal handed to
	// OnSignal is acknowledged only by Client.Ack (deferack.go), so one
	// the application holds but has not yet passed on is delivered again
	// to the session's next client. Client.Ack is paced by AckInterval too.
	// Default false: acked after OnSignal.
	DeferAck bool
	// AckInterval is the least time between two acknowledgements the client
	// sends, by itself or for Client.Ack (DeferAck): the signals handled meanwhile are
	// acknowledged together once it has passed, so that a recipient handed
	// signals one at a time, faster than the hub lets a connection send
	// frames (MARCONI_WS_FRAMES_PER_SECOND, default 100, pings included), is
	// not cut off (close 1008, quota_exceeded) for acknowledging each. After
	// a quiet spell a signal is acknowledged at once. Default 500ms: at most
	// 2 acknowledgements a second; the signals of the last interval, not yet
	// acknowledged, come again to the session's next client after a crash or
	// Close (docs/client.md, "Receiving").
	AckInterval time.Duration
	// Logger receives the client's diagnostics; nil discards them.
	Logger *slog.Logger

	// ReconnectBaseDelay is the backoff ceiling of the first redial of a
	// dropped WebSocket; each failed attempt doubles it. Default 250ms.
	ReconnectBaseDelay time.Duration
	// ReconnectMaxDelay caps the backoff ceiling. Default 15s. The actual
	// wait is uniform between zero and the ceiling (full jitter).
	ReconnectMaxDelay time.Duration
	// ReconnectRestartMaxDelay caps the backoff ceiling instead while the
	// hub restarts: from a close with 1012 (service restart) until the next
	// attach. The hub said it is coming back, so waiting for a ceiling of
	// 15 s only lengthens the outage; full jitter still spreads its clients
	// over the window. Default 4s, and never above ReconnectMaxDelay.
	ReconnectRestartMaxDelay time.Duration

	// PingInterval is how often the client pings the hub on its WebSocket
	// to find a path that died silently (no FIN: a NAT or balancer that
	// dropped it, a frozen host), which otherwise goes unnoticed until the
	// agent sends. Default 20s; negative disables the keepalive.
	PingInterval time.Duration
	// PingTimeout is how long the client waits for the hub's pong. A ping
	// unanswered within it marks the connection dead: it is closed and
	// redialed with the usual backoff (Stats.PingTimeouts). No ping is judged
	// while OnSignal holds the reader up, since the pong then waits unread.
	// Default 10s.
	PingTimeout time.Duration

	// SendAttempts bounds how often Send makes one send when its answer is
	// lost (connection failed) or the hub answers 502, 503 or 504; every
	// attempt carries the same idempotency key, so the hub stores the signal
	// once. Default 4; 1 never retries. The waits between attempts follow
	// the reconnect backoff; ctx bounds them all. A registration is retried
	// the same way, with an Idempotency-Key of its own, so that one whose
	// answer was lost is answered with a new token instead of 403.
	SendAttempts int

	// TokenStore, when set, keeps the session token across runs of the
	// agent: Dial loads it and, when it holds a token for SessionID (or
	// SessionID is empty), resumes that session with it instead of
	// registering anew; every new token the hub gives the client
	// (registration, resume, re-registration, takeover) is saved to it, with
	// the session's tenant and project, which the resume and everything after
	// it name to the balancer (X-Marconi-Project). A failed Load or a failed
	// save at Dial fails Dial; a failed save later is logged at error level.
	// FileTokenStore keeps it in a 0600 file.
	TokenStore TokenStore
	// Takeover, when true, lets Dial reclaim a live session whose token it
	// does not hold (an agent killed before it could keep its token, or whose
	// kept token is no longer current): a registration refused 403 because
	// the id is live is made again with "takeover": true, which the hub
	// answers with a new token while the old token stops working and its
	// WebSocket closes with 4409. Pending signals stay; OnAffinityReset is
	// called, since whatever the session held at runtime is gone. The hub
	// must allow it (MARCONI_ALLOW_TAKEOVER). Default false: Dial fails 403.
	Takeover bool
	// OnFatal is called once when the client stops for good while running
	// (not at Dial, which returns its error, nor at Close or Deregister):
	// the hub refused the session while the client reconnected (an *Error,
	// e.g. 401 unauthorized after the hub lost the API key, 403 forbidden),
	// or a newer connection of the session replaced this one (ErrReplaced,
	// close 4409, e.g. a takeover by another process). From then on the
	// client neither reconnects nor heartbeats; Close it. It is called on
	// the client's supervising goroutine and must not call Close itself
	// (Close waits for that goroutine): signal another goroutine to. Nil:
	// the stop is only logged.
	OnFatal func(error)
	// RateLimitWait bounds how long one registration or one Send waits in
	// all for 429 answers (too_many_requests, quota_exceeded) before it
	// returns the last one: each 429 is waited out for its Retry-After
	// (with a little jitter), or with the reconnect backoff when the header
	// is missing or unusable, and the call made again; a Retry-After that
	// would outlast what is left of this bound or of ctx's deadline, and a
	// quota_exceeded without one (the hub's way of saying waiting does not
	// help), are returned at once. Default 1m; negative never waits.
	RateLimitWait time.Duration

	// HTTPClient, when set, carries every HTTP call and WebSocket dial of the
	// client instead of a transport of its own. Many clients in one process
	// can then share one bounded pool of keep-alive connections (each
	// client's own transport holds an idle connection beside its
	// WebSocket). The caller owns it: Close leaves its idle connections
	// alone. Default nil: the client owns a clone of http.DefaultTransport
	// that keeps up to IdleConnsPerHost idle connections per host (the
	// clone's own default, 2, would close all but two of the connections
	// of concurrent Sends after each burst, and dial them again for the
	// next).
	HTTPClient *http.Client
	// IdleConnsPerHost bounds the idle keep-alive connections the client's
	// own transport keeps to each hub or instance URL, for calls made
	// concurrently (Send from several goroutines); connections idle for 90 s
	// are closed. Default 16. Not used with HTTPClient.
	IdleConnsPerHost int

	// NoHolderRouting turns off sending to the recipient's instance. By
	// default, when a send's answer names the instance holding the
	// recipient's queue (recipient_instance_url), the client sends that
	// recipient's next signals there, with the same session token, and goes
	// back to the hub URL when an answer names none. Only a send that
	// certainly did not reach that instance (its dial failed, or a balancer
	// answered 502 or 503 itself) is sent through the hub URL at once;
	// docs/client.md, "Sending to the recipient's instance".
	NoHolderRouting bool
	// HolderHints bounds how many recipients' instance URLs the client
	// remembers (and how many unreachable ones it leaves alone). Default 1024.
	HolderHints int
	// HolderRetryAfter is how long an instance URL that could not be reached
	// is not sent to: its recipients' sends go through the hub URL, without a
	// dial each. Default 30s.
	HolderRetryAfter time.Duration
}

// Client is one registered, attached session. It is safe for concurrent use:
// Send, Stats and SessionID may be called from any goroutine; Close once
// stops it.
type Client struct {
	cfg       Config
	urls      []string     // HubURL then HubURLs, without trailing slashes
	cur       atomic.Int64 // index in urls of the URL in use
	log       *slog.Logger
	transport *http.Transport // nil when cfg.HTTPClient is the caller's
	http      *http.Client
	backoff   backoff

	ctx       context.Context // ends at Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup // every goroutine the client started
	closeOnce sync.Once
	fatalOnce sync.Once // Config.OnFatal is called once

	deliveries chan delivery // to the dispatcher; bounded
	// flushAcks asks the dispatcher to send the ack its pacing holds back
	// now, and closes the channel it is given once it has (Close).
	flushAcks chan chan struct{}
	// deferredAck (cap 1) tells the dispatcher that Client.Ack holds an ack
	// back (deferred), to be sent once AckInterval has passed.
	deferredAck chan struct{}
	deferred    deferredAcks
	heal        chan struct{} // cap 1: wakes the supervisor for a self-heal reconnect
	regMu       sync.Mutex    // serializes (re)registrations
	// regKey is the Idempotency-Key of the registration under way, reused by
	// its retries and cleared once one is answered; guarded by regMu.
	regKey string
	// keptToken is the token loaded from Config.TokenStore at Dial, for the
	// first registration to resume with; guarded by regMu.
	keptToken string

	mu        sync.Mutex
	sessionID string
	token     string
	epoch     uint64        // registration count: a new registration starts seq afresh
	hbEvery   time.Duration // heartbeat interval from the last registration
	conn      *websocket.Conn
	gen       uint64 // connection generation, +1 per successful attach
	healFor   uint64 // generation for which a self-heal reconnect was requested
	immediate bool   // the next redial skips the backoff wait
	stopped   bool   // the supervisor gave up: replaced (4409) or refused by the hub
	ending    bool   // Deregister is under way: the session is being ended on purpose
	// connHistory is the store history the welcome of generation gen
	// named (history.go).
	connHistory string

	// highest is the highest seq handed to OnSignal, with the registration
	// (epoch) and the store history it belongs to, for drain: a new
	// registration numbers its signals from 1 again, and a new history may
	// have given its seqs to other signals (history.go). Guarded by mu.
	highest seqMark
	// held records, with Config.DeferAck, the registration of each signal
	// handed to OnSignal and not yet acknowledged by Client.Ack.
	held heldSignals
	// registration is what the hub said of the session at its last
	// registration or resume. Guarded by mu.
	registration Registration

	// holders routes sends to the recipient's instance; nil with
	// Config.NoHolderRouting.
	holders *holders
	// lastAuthorization is the Authorization value of the last call
	// (authorization).
	lastAuthorization atomic.Pointer[authorizationHeader]
	// project is the X-Marconi-Project header's value of every request once
	// the session is registered (adopt); nil before.
	project atomic.Pointer[[]string]

	reconnects, selfHeals, reregistrations, droppedAtReset, pingTimeouts, takeovers, rateLimited atomic.Int64
	holderSends, holderFallbacks                                                                 atomic.Int64
	acks                                                                                         atomic.Int64
}

const (
	defaultHeartbeat = 20 * time.Second
	// readLimit bounds one WebSocket message from the hub: a signal's payload
	// may be 64 KiB by default, larger when the hub allows it.
	readLimit = 4 << 20
	// maxWrongInstanceHops bounds how many 409 wrong_instance redirects one
	// attach follows.
	maxWrongInstanceHops = 3
	// drainTimeout bounds the drain before each redial: on a path that died
	// silently it would otherwise wait for an answer that never comes.
	drainTimeout         = 15 * time.Second
	deliveryQueue        = 64
	defaultSendAttempts  = 4
	defaultPingInterval  = 20 * time.Second
	defaultPingTimeout   = 10 * time.Second
	defaultRateLimitWait = time.Minute
	// defaultIdleConnsPerHost is Config.IdleConnsPerHost's default.
	defaultIdleConnsPerHost = 16
)

// welcomeTimeout bounds an attach's upgrade request and, again, the wait for
// its welcome. A variable so that tests can shorten it.
var welcomeTimeout = 15 * time.Second

// errClosed is returned by calls on a closed client.
var errClosed = fmt.Errorf("bootstrap: client closed: %w", net.ErrClosed)

// start builds a client, loads its kept token and starts its delivery loop:
// what Dial and DialPiggyback share before they reach the hub.
func start(ctx context.Context, cfg Config) (*Client, error) {
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	if err := c.loadToken(ctx); err != nil {
		c.closeIdle()
		return nil, err
	}
	c.wg.Add(1)
	go c.dispatch()
	return c, nil
}

// Dial registers the session (a new one, or the one named by cfg.SessionID),
// attaches its WebSocket and starts the heartbeat, read and delivery loops.
// With several hub URLs it tries each once, in order, while they are
// unreachable or unavailable.
// It returns once the hub has welcomed the connection, or with the error that
// stopped it (an *Error when the hub answered one). ctx bounds only the dial;
// the client lives until Close.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	c, err := start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	conn, gen, err := c.connect(ctx)
	for i := 1; i < len(c.urls) && unavailable(err) && ctx.Err() == nil; i++ {
		conn, gen, err = c.connect(ctx) // the failed URL was left: try the next
	}
	if err != nil {
		c.cancel()
		c.wg.Wait()
		c.closeIdle()
		return nil, err
	}
	c.wg.Add(2)
	go c.supervise(conn, gen)
	go c.heartbeatLoop()
	return c, nil
}

func newClient(cfg Config) (*Client, error) {
	urls, err := hubURLs(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.APIKey == "" {
		return nil, errors.New("bootstrap: APIKey is required")
	}
	if cfg.Surface == "" {
		return nil, errors.New("bootstrap: Surface is required")
	}
	if cfg.ReconnectBaseDelay < 0 || cfg.ReconnectMaxDelay < 0 || cfg.ReconnectRestartMaxDelay < 0 {
		return nil, errors.New("bootstrap: reconnect delays must not be negative")
	}
	if cfg.ReconnectBaseDelay == 0 {
		cfg.ReconnectBaseDelay = defaultReconnectBaseDelay
	}
	if cfg.ReconnectMaxDelay == 0 {
		cfg.ReconnectMaxDelay = max(defaultReconnectMaxDelay, cfg.ReconnectBaseDelay)
	}
	if cfg.ReconnectRestartMaxDelay == 0 {
		cfg.ReconnectRestartMaxDelay = max(defaultReconnectRestartMaxDelay, cfg.ReconnectBaseDelay)
	}
	cfg.ReconnectRestartMaxDelay = min(cfg.ReconnectRestartMaxDelay, cfg.ReconnectMaxDelay)
	if cfg.SendAttempts < 0 {
		return nil, errors.New("bootstrap: SendAttempts must not be negative")
	}
	if cfg.SendAttempts == 0 {
		cfg.SendAttempts = defaultSendAttempts
	}
	if cfg.PingTimeout < 0 {
		return nil, errors.New("bootstrap: PingTimeout must not be negative")
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = defaultPingInterval
	}
	if cfg.PingTimeout == 0 {
		cfg.PingTimeout = defaultPingTimeout
	}
	if cfg.RateLimitWait == 0 {
		cfg.RateLimitWait = defaultRateLimitWait
	}
	if cfg.AckInterval < 0 {
		return nil, errors.New("bootstrap: AckInterval must not be negative")
	}
	if cfg.AckInterval == 0 {
		cfg.AckInterval = defaultAckInterval
	}
	if cfg.IdleConnsPerHost < 0 {
		return nil, errors.New("bootstrap: IdleConnsPerHost must not be negative")
	}
	if cfg.IdleConnsPerHost == 0 {
		cfg.IdleConnsPerHost = defaultIdleConnsPerHost
	}
	if cfg.HolderHints < 0 || cfg.HolderRetryAfter < 0 {
		return nil, errors.New("bootstrap: HolderHints and HolderRetryAfter must not be negative")
	}
	if cfg.HolderHints == 0 {
		cfg.HolderHints = defaultHolderHints
	}
	if cfg.HolderRetryAfter == 0 {
		cfg.HolderRetryAfter = defaultHolderRetryAfter
	}
	if cfg.ReconnectMaxDelay < cfg.ReconnectBaseDelay {
		return nil, errors.New("bootstrap: ReconnectMaxDelay is below ReconnectBaseDelay")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Unless given a client, it owns its transport so that Close can release
	// its idle connections: nothing of the client outlives Close.
	var tr *http.Transport
	hc := cfg.HTTPClient
	if hc == nil {
		tr = http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = cfg.IdleConnsPerHost
		// The hub never compresses an answer: asking for gzip only cost
		// each request a header of its own.
		tr.DisableCompression = true
		hc = &http.Client{Transport: tr}
	}
	c := &Client{
		cfg:         cfg,
		urls:        urls,
		log:         log,
		transport:   tr,
		http:        hc,
		backoff:     backoff{base: cfg.ReconnectBaseDelay, max: cfg.ReconnectMaxDelay, int63n: rand.Int64N},
		deliveries:  make(chan delivery, deliveryQueue),
		flushAcks:   make(chan chan struct{}),
		deferredAck: make(chan struct{}, 1),
		heal:        make(chan struct{}, 1),
		sessionID:   cfg.SessionID,
		hbEvery:     defaultHeartbeat,
	}
	if !cfg.NoHolderRouting {
		c.holders = newHolders(cfg.HolderHints, cfg.HolderRetryAfter, urls)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// hubURLs checks and lists the URLs of cfg: HubURL first, then HubURLs,
// each once.
func hubURLs(cfg Config) ([]string, error) {
	var out []string
	for _, raw := range append([]string{cfg.HubURL}, cfg.HubURLs...) {
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("bootstrap: hub URL %q is not an http(s) URL", raw)
		}
		if s := strings.TrimRight(raw, "/"); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("bootstrap: HubURL (or HubURLs) is required")
	}
	return out, nil
}

// hub returns the URL in use and its index, for failover.
func (c *Client) hub() (string, int64) {
	i := c.cur.Load()
	return c.urls[i], i
}

// failover moves off the URL of index i to the next one, unless another call
// has moved already. With one URL it does nothing.
func (c *Client) failover(i int64, cause error) {
	if len(c.urls) == 1 {
		return
	}
	next := (i + 1) % int64(len(c.urls))
	if c.cur.CompareAndSwap(i, next) {
		c.log.Warn("marconi: hub unreachable or unavailable; failing over",
			"from", c.urls[i], "to", c.urls[next], "err", cause)
	}
}

// SessionID is the session's id, as the hub registered it.
func (c *Client) SessionID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessionID
}

// Stats returns what the client has done so far to keep its route.
func (c *Client) Stats() Stats {
	return Stats{
		Reconnects:         int(c.reconnects.Load()),
		SelfHealReconnects: int(c.selfHeals.Load()),
		Reregistrations:    int(c.reregistrations.Load()),
		DroppedAtReset:     int(c.droppedAtReset.Load()),
		PingTimeouts:       int(c.pingTimeouts.Load()),
		Takeovers:          int(c.takeovers.Load()),
		RateLimited:        int(c.rateLimited.Load()),
		HolderSends:        int(c.holderSends.Load()),
		HolderFallbacks:    int(c.holderFallbacks.Load()),
		Acks:               int(c.acks.Load()),
	}
}

// Close closes the WebSocket normally (1000) and stops every goroutine the
// client started, waiting for them (and for a running OnSignal to return).
// The session stays registered on the hub until its TTL runs out; signals not
// yet acknowledged are delivered again to the next client of the session.
// Close is idempotent and always returns nil.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.flushPendingAck()
		c.cancel()
		c.wg.Wait()
		c.closeIdle()
	})
	return nil
}

// flushTimeout bounds how long Close waits for the ack that the pacing
// (AckInterval) holds back to be sent.
const flushTimeout = 2 * time.Second

// flushPendingAck has the dispatcher send, now, the ack that AckInterval
// holds back, so that a client closed within the interval of its last
// signals does not leave them to come again to the session's next client.
// It waits at most flushTimeout, and not at all once the client has ended.
func (c *Client) flushPendingAck() {
	done := make(chan struct{})
	t := time.NewTimer(flushTimeout)
	defer t.Stop()
	select {
	case c.flushAcks <- done:
	case <-c.ctx.Done():
		return
	case <-t.C:
		return
	}
	select {
	case <-done:
	case <-t.C:
	}
}

// closeIdle releases the idle connections of the client's own transport; a
// Config.HTTPClient is the caller's to close.
func (c *Client) closeIdle() {
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
}

// auth is what one session call used: the token, and the registration epoch
// and connection generation current when it started.
type auth struct {
	token      string
	epoch, gen uint64
}

func (c *Client) currentAuth() auth {
	c.mu.Lock()
	defer c.mu.Unlock()
	return auth{token: c.token, epoch: c.epoch, gen: c.gen}
}

// requestSelfHeal closes the WebSocket of generation gen and has the
// supervisor run the connect sequence again, unless that was already done or
// requested for gen: many sends answered sender_route_stale at once cause one
// reconnect.
func (c *Client) requestSelfHeal(gen uint64) {
	c.mu.Lock()
	if c.ctx.Err() != nil || c.stopped || c.gen > gen || c.healFor >= gen {
		c.mu.Unlock()
		return
	}
	c.healFor = gen
	c.immediate = true
	c.mu.Unlock()
	c.selfHeals.Add(1)
	c.log.Info("marconi: sender route stale, reconnecting", "session_id", c.SessionID(), "generation", gen)
	select {
	case c.heal <- struct{}{}:
	default: // a wake-up is already pending
	}
}
