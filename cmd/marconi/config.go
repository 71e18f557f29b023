package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/fabric/natsbus"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/migrations"
	"github.com/marconihub/marconi/sessionstore/breaker"
	"github.com/marconihub/marconi/sessionstore/pgstore"
	"github.com/marconihub/marconi/signals"
	"github.com/marconihub/marconi/signals/selfheal"
)

// Config is everything the hub reads from its environment and flags.
type Config struct {
	Addr        string
	DatabaseURL string
	LogLevel    string
	// Hub is the hub's configuration, including self-heal and fabric.
	Hub hub.Config
	// InstanceHeartbeat is how often this instance heartbeats into the store.
	InstanceHeartbeat time.Duration
	// ShutdownTimeout bounds graceful shutdown.
	ShutdownTimeout time.Duration
	// MaxHeaderBytes is the HTTP server's bound on a request's line and
	// headers (MARCONI_MAX_HEADER_BYTES).
	MaxHeaderBytes int
	// GroupCommit gathers concurrent durable sends into one transaction
	// (Postgres store); off is kept to measure what it gains.
	GroupCommit bool
	// GroupCommitMaxBatch is how many sends one group commit carries at most.
	GroupCommitMaxBatch int
	// StoreBatchesInFlight is how many group commits run at once
	// (MARCONI_STORE_BATCHES_IN_FLIGHT); each holds a pooled connection.
	StoreBatchesInFlight int
	// StoreAcksPerBatch is how many acknowledgements a group commit
	// carries beside other writes; 0: no bound
	// (MARCONI_STORE_ACKS_PER_BATCH).
	StoreAcksPerBatch int
	// AckedPayloadBytes is the largest payload an acknowledged signal keeps
	// until pruned, Postgres store (MARCONI_RETAIN_ACKED_PAYLOAD_BYTES).
	AckedPayloadBytes int
	// StoreQuotaLeaseBytes is how many bytes of a project's pending-bytes
	// room a batch lane leases at a time; 0 turns leases off
	// (MARCONI_STORE_QUOTA_LEASE_BYTES).
	StoreQuotaLeaseBytes int64
	// DatabaseMaxConns is the size of the Postgres connection pool.
	DatabaseMaxConns int
	// StoreBreaker puts the Postgres store behind a circuit breaker that
	// fails calls at once after a timeout, until a probe succeeds.
	StoreBreaker bool
	// StoreProbeEvery is how often an open breaker probes the store.
	StoreProbeEvery time.Duration
	// BusURL is the NATS server the instances wake each other through;
	// empty means Postgres LISTEN/NOTIFY (MARCONI_BUS_URL).
	BusURL string
	// BusQueueSize bounds the wake-ups received from NATS and not yet
	// handled (MARCONI_BUS_QUEUE_SIZE).
	BusQueueSize int
	// BusKey is when each instance reads the bus key again
	// (MARCONI_BUS_KEY_REFRESH_SECONDS, MARCONI_BUS_KEY_GRACE_SECONDS,
	// MARCONI_BUS_KEY_RECHECK_MS).
	BusKey pgstore.BusKeyTimings
	// generatedAPIKey and generatedAdminToken are set when development mode
	// made them; they are printed once at start.
	generatedAPIKey     string
	generatedAdminToken string
	// devCredentialsFile is where generated development credentials are
	// kept (see devcreds.go); empty when none were generated.
	devCredentialsFile string
	// resolved is every setting's effective value and its source, for
	// `marconi config`.
	resolved []resolved
}

// setting is one environment variable and its flag (MARCONI_FOO_BAR is
// --foo-bar).
type setting struct {
	env  string
	def  string
	help string
	set  func(c *Config, v string) error
	// visibility says whether `marconi config` may print the value.
	visibility visibility
}

// visibility is whether a setting's value may be printed: a secret one is
// masked wherever the configuration is shown.
type visibility bool

// The two visibilities a setting is declared with.
const (
	public visibility = false
	secret visibility = true
)

func seconds(dst *time.Duration) func(*Config, string) error {
	return func(_ *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n > maxSeconds {
			return fmt.Errorf("want a positive whole number of seconds, at most %d, got %q", maxSeconds, v)
		}
		*dst = time.Duration(n) * time.Second
		return nil
	}
}

// cacheMillis parses how long a cached answer serves, in whole
// milliseconds from 0 to 60000, into dst; 0 turns the cache off (a
// negative duration: the hub's zero means its default).
func cacheMillis(dst *time.Duration) func(*Config, string) error {
	return func(_ *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 60_000 {
			return fmt.Errorf("want whole milliseconds from 0 to 60000, got %q", v)
		}
		*dst = time.Duration(n) * time.Millisecond
		if n == 0 {
			*dst = -1 // off
		}
		return nil
	}
}

// maxSeconds is the most whole seconds a time.Duration holds (about 292
// years): more would wrap round to a negative duration.
const maxSeconds = math.MaxInt64 / int64(time.Second)

// defaultShutdownTimeout is the default of MARCONI_SHUTDOWN_TIMEOUT_SECONDS.
const defaultShutdownTimeout = 15 * time.Second

// secs spells a default duration as the whole seconds its setting takes.
func secs(d time.Duration) string { return strconv.Itoa(int(d / time.Second)) }

func positiveInt(dst *int) func(*Config, string) error {
	return func(_ *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a positive whole number, got %q", v)
		}
		*dst = n
		return nil
	}
}

// defaultDatabaseMaxConns sizes the pool for a send's reads beside the one
// connection a group commit holds.
const defaultDatabaseMaxConns = 8

// maxBatchesInFlight bounds MARCONI_STORE_BATCHES_IN_FLIGHT: past a few,
// batches only wait on one another's locks and WAL flushes.
const maxBatchesInFlight = 16

func nonNegativeInt(dst *int) func(*Config, string) error {
	return func(_ *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a whole number, 0 or more, got %q", v)
		}
		*dst = n
		return nil
	}
}

func positiveInt64(dst *int64) func(*Config, string) error {
	return func(_ *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a positive whole number, got %q", v)
		}
		*dst = n
		return nil
	}
}

func positiveFloat(dst *float64) func(*Config, string) error {
	return func(_ *Config, v string) error {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || !(n > 0) || math.IsInf(n, 1) {
			return fmt.Errorf("want a positive number, got %q", v)
		}
		*dst = n
		return nil
	}
}

func oneOf[T ~string](dst *T, allowed ...T) func(*Config, string) error {
	return func(_ *Config, v string) error {
		names := make([]string, len(allowed))
		for i, a := range allowed {
			if T(v) == a {
				*dst = a
				return nil
			}
			names[i] = string(a)
		}
		return fmt.Errorf("want one of %s, got %q", strings.Join(names, ", "), v)
	}
}

func parseBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "1", "true", "on", "yes":
		return true, nil
	case "0", "false", "off", "no":
		return false, nil
	}
	return false, fmt.Errorf("want true or false, got %q", v)
}

// settings lists every setting, its default and its meaning. docs/operations.md
// documents the same table.
func settings(c *Config) []setting {
	h := &c.Hub
	return []setting{
		{"MARCONI_ADDR", "", "address to listen on (default: 127.0.0.1:8080 in development, :8080 in lan and cloud)", func(c *Config, v string) error { c.Addr = v; return nil }, public},
		{"MARCONI_MODE", string(hub.DefaultMode), "development, lan or cloud", oneOf(&h.Mode, marconi.DeploymentModes...), public},
		{"MARCONI_DATABASE_URL", "", "Postgres URL (postgres://…, or the keyword/value form host=… dbname=…; several hosts with target_session_attrs=read-write for a replicated database); empty runs on the embedded in-memory store", func(c *Config, v string) error {
			if v == "" {
				c.DatabaseURL = ""
				return nil
			}
			if err := checkDatabaseURL(v); err != nil {
				return err
			}
			c.DatabaseURL = v
			return nil
		}, secret},
		{"MARCONI_BUS_URL", "", "NATS server the instances wake each other through (nats://host:4222, comma separated for a cluster; needs MARCONI_DATABASE_URL); empty uses Postgres LISTEN/NOTIFY. NATS down means slower cross-instance delivery (the pending sweep), never a lost or refused send", func(c *Config, v string) error {
			for _, s := range strings.Split(v, ",") {
				if v == "" {
					break
				}
				u, err := url.Parse(strings.TrimSpace(s))
				if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" {
					return fmt.Errorf("want nats://host:port or tls://host:port, comma separated")
				}
			}
			c.BusURL = v
			return nil
		}, secret},
		{"MARCONI_BUS_QUEUE_SIZE", strconv.Itoa(natsbus.DefaultQueueSize), "wake-ups received from NATS and not yet handled; past it NATS drops them and every local queue catches up from the store", positiveInt(&c.BusQueueSize), public},
		{"MARCONI_BUS_KEY_REFRESH_SECONDS", secs(pgstore.DefaultBusKeyRefresh), "each instance reads the bus key again this often: within it, every instance seals with a rotated key", seconds(&c.BusKey.Refresh), public},
		{"MARCONI_BUS_KEY_GRACE_SECONDS", secs(pgstore.DefaultBusKeyGrace), "after a rotation, the previous bus key still opens carried signals this long (longer than MARCONI_BUS_KEY_REFRESH_SECONDS); a leaked key is worthless this long after it is rotated out", seconds(&c.BusKey.Grace), public},
		{"MARCONI_BUS_KEY_RECHECK_MS", strconv.Itoa(int(pgstore.DefaultBusKeyRecheck / time.Millisecond)), "a carried signal no known bus key opens has the key read again, at most once per this many milliseconds", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 10 || n > 3_600_000 {
				return fmt.Errorf("want a whole number of milliseconds from 10 to 3600000, got %q", v)
			}
			c.BusKey.Recheck = time.Duration(n) * time.Millisecond
			return nil
		}, public},
		{"MARCONI_LOG_LEVEL", "info", "debug, info, warn or error", oneOf(&c.LogLevel, "debug", "info", "warn", "error"), public},
		{"MARCONI_SELFHEAL", "", "SPEC-168 self-heal hints on or off (default: on in development, off in lan and cloud)", nil, public},
		{"MARCONI_SELFHEAL_FRESHNESS_SECONDS", secs(selfheal.DefaultFreshness), "route-state freshness window and recipient recency gate", seconds(&h.SelfHeal.Freshness), public},
		{"MARCONI_SELFHEAL_SENDER_STALE_THRESHOLD_SECONDS", secs(selfheal.DefaultSenderStaleThreshold), "sender recency gate", seconds(&h.SelfHeal.SenderStaleThreshold), public},
		{"MARCONI_SELFHEAL_MAX_ATTEMPTS_PER_SESSION", strconv.Itoa(selfheal.DefaultMaxAttempts), "token bucket capacity per side and session", positiveInt(&h.SelfHeal.MaxAttempts), public},
		{"MARCONI_SELFHEAL_TOKEN_REFILL_SECONDS", secs(selfheal.DefaultRefillPeriod), "time for an empty bucket to refill", seconds(&h.SelfHeal.RefillPeriod), public},
		{"MARCONI_SESSION_TTL_SECONDS", secs(hub.DefaultSessionTTL), "a session expires this long after its freshest proof of life", seconds(&h.SessionTTL), public},
		{"MARCONI_HEARTBEAT_INTERVAL_SECONDS", secs(hub.DefaultHeartbeatInterval), "heartbeat interval told to clients at registration", seconds(&h.HeartbeatInterval), public},
		{"MARCONI_TOUCH_INTERVAL_SECONDS", secs(hub.DefaultTouchInterval), "proof-of-life writes per session are coalesced to one per interval", seconds(&h.TouchInterval), public},
		{"MARCONI_STORE_TIMEOUT_SECONDS", secs(hub.DefaultStoreTimeout), "bound on each store call of a request; past it the hub answers 503", seconds(&h.StoreTimeout), public},
		{"MARCONI_MAX_HEADER_BYTES", strconv.Itoa(hub.DefaultMaxHeaderBytes), "bound on a request's line and headers (net/http adds 4096); past it 431 headers_too_large", positiveInt(&c.MaxHeaderBytes), public},
		{"MARCONI_BODY_READ_TIMEOUT_SECONDS", secs(hub.DefaultBodyReadTimeout), "bound on reading a request body, apart from the store timeout (408 request_timeout past it)", seconds(&h.BodyReadTimeout), public},
		{"MARCONI_STORE_BREAKER", "on", "after a store call times out, fail calls at once (503) until a probe reaches the store: on or off", func(c *Config, v string) error {
			b, err := parseBool(v)
			c.StoreBreaker = b
			return err
		}, public},
		{"MARCONI_STORE_PROBE_INTERVAL_MS", strconv.Itoa(int(breaker.DefaultProbeEvery / time.Millisecond)), "how often an open store breaker probes the store", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 10 || n > 3_600_000 {
				return fmt.Errorf("want a whole number of milliseconds from 10 to 3600000, got %q", v)
			}
			c.StoreProbeEvery = time.Duration(n) * time.Millisecond
			return nil
		}, public},
		{"MARCONI_READYZ_CACHE_MS", strconv.Itoa(int(hub.DefaultReadyzCache / time.Millisecond)), "how long one store probe answers /readyz (0: every check probes; a store failure met by any call ends it at once)", cacheMillis(&h.ReadyzCache), public},
		{"MARCONI_RECONNECT_GRACE_SECONDS", secs(fabric.DefaultGrace), "reconnect grace window of sticky affinity", seconds(&h.Fabric.Grace), public},
		{"MARCONI_INSTANCE_ID", "", "this instance's id (default: the host name)", func(c *Config, v string) error {
			if v == "" {
				host, err := os.Hostname()
				if err != nil || host == "" {
					host = "marconi"
				}
				v = host
			}
			if len(v) > 128 {
				return errors.New("longer than 128 characters")
			}
			c.Hub.InstanceID = v
			return nil
		}, public},
		{"MARCONI_PUBLIC_URL", "", "URL clients reach this instance at (default: http://127.0.0.1:PORT)", func(c *Config, v string) error {
			if v == "" {
				return nil
			}
			u, err := url.Parse(v)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("want an http(s) URL, got %q", v)
			}
			// Clients append paths to it, and every send answer naming
			// this instance carries it: a query or fragment would break
			// those URLs, and a user or password would go to every agent.
			if u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(v, "#") {
				return errors.New("want a scheme, host and optional path only: no user, password, query or fragment")
			}
			c.Hub.PublicURL = strings.TrimRight(v, "/")
			return nil
		}, public},
		{"MARCONI_INSTANCE_DEAD_AFTER_SECONDS", secs(fabric.DefaultDeadAfter), "an instance whose heartbeat is older is unhealthy", seconds(&h.Fabric.DeadAfter), public},
		{"MARCONI_INSTANCE_HEARTBEAT_SECONDS", secs(fabric.DefaultHeartbeatEvery), "how often this instance heartbeats into the store", seconds(&c.InstanceHeartbeat), public},
		{"MARCONI_INSTANCE_PROBE_MILLISECONDS", fmt.Sprint(fabric.DefaultProbeEvery.Milliseconds()), "how often this instance asks Postgres which instances' connections are alive (a killed one is dead within about this long)", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 50 || n > 60000 {
				return fmt.Errorf("want a whole number of milliseconds from 50 to 60000, got %q", v)
			}
			c.Hub.Fabric.ProbeEvery = time.Duration(n) * time.Millisecond
			return nil
		}, public},
		{"MARCONI_ADAPTIVE_PLACEMENT", "off", "adaptive classifier gate: off or on", func(c *Config, v string) error {
			switch v {
			case "on":
				c.Hub.Fabric.Placement.Adaptive = true
			case "off":
				c.Hub.Fabric.Placement.Adaptive = false
			default:
				return fmt.Errorf("want on or off, got %q", v)
			}
			return nil
		}, public},
		{"MARCONI_ADAPTIVE_CLIENTS", "", "comma list of client ids the classifier may place (* for all)", func(c *Config, v string) error {
			c.Hub.Fabric.Placement.AdaptiveClients = fabric.ParseClientList(v)
			return nil
		}, public},
		{"MARCONI_ADAPTIVE_ROLLBACK_AFTER", "0", "roll the adaptive gate back once the cluster-wide placement mismatches reach this many (0: never)", func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("want a whole number, 0 or more, got %q", v)
			}
			c.Hub.Fabric.Placement.RollbackAfter = n
			return nil
		}, public},
		{"MARCONI_DEFAULT_RUNTIME_MODE", string(fabric.DefaultRuntimeMode), "runtime mode of a registration that names none", func(c *Config, v string) error {
			m, err := fabric.NormalizeRuntimeMode(fabric.Mode(v))
			if err != nil {
				return err
			}
			c.Hub.Fabric.Placement.DefaultMode = m
			return nil
		}, public},
		{"MARCONI_STICKY_PLACEMENT", string(fabric.DefaultStickyPlacement), "where a new sticky session is placed: fewest (the healthy instance with the fewest sticky sessions) or project (where most of its project's sessions are)", oneOf(&h.Fabric.Placement.Sticky, fabric.StickyByLoad, fabric.StickyByProject), public},
		{"MARCONI_DISCONNECT_POLICY", fabric.DefaultDisconnectPolicy, "retain or drop a sticky session's pending signals at an affinity reset", oneOf(&h.Fabric.DisconnectPolicy, fabric.PolicyRetain, fabric.PolicyDrop), public},
		{"MARCONI_API_KEYS", "", "key1=tenant/project,key2=tenant/project", func(c *Config, v string) error {
			keys, err := parseAPIKeys(v)
			c.Hub.APIKeys = keys
			return err
		}, secret},
		{"MARCONI_ADMIN_TOKEN", "", "admin token for /v1/ops/* (development generates one when empty)", func(c *Config, v string) error {
			if v != "" && len(v) < 16 {
				return errors.New("shorter than 16 characters")
			}
			c.Hub.AdminToken = v
			return nil
		}, secret},
		{"MARCONI_PPROF", "off", "serve Go's runtime profiles (CPU, heap, goroutines, trace) under /debug/pprof/ to the admin token: on or off", func(c *Config, v string) error {
			b, err := parseBool(v)
			c.Hub.Pprof = b
			return err
		}, public},
		{"MARCONI_DEV_CREDENTIALS_FILE", "", "where development mode keeps its generated API key and admin token, reused at every start (default: $XDG_STATE_HOME/marconi/dev-credentials)", nil, public},
		{"MARCONI_MAX_PAYLOAD_BYTES", strconv.Itoa(signals.DefaultMaxPayloadBytes), "largest encoded payload of one signal", positiveInt(&h.MaxPayloadBytes), public},
		{"MARCONI_WS_PING_SECONDS", secs(hub.DefaultWSPingInterval), "WebSocket ping interval; a pong later than one more interval drops the peer", seconds(&h.WSPingInterval), public},
		{"MARCONI_WS_READ_LIMIT_BYTES", strconv.Itoa(hub.DefaultWSReadLimit), "largest frame read from a client (1009 past it)", func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 128 {
				return fmt.Errorf("want a whole number of at least 128, got %q", v)
			}
			c.Hub.WSReadLimit = n
			return nil
		}, public},
		{"MARCONI_WS_QUEUE_SIZE", strconv.Itoa(hub.DefaultWSQueueSize), "per-connection outgoing queue; overflow closes with 4429", positiveInt(&h.WSQueueSize), public},
		{"MARCONI_WS_ACK_INTERVAL_MS", strconv.Itoa(int(hub.DefaultWSAckInterval / time.Millisecond)), "a connection's acks are coalesced (newest wins) and written at most once per interval, and on close", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || n > 10000 {
				return fmt.Errorf("want whole milliseconds from 1 to 10000, got %q", v)
			}
			c.Hub.WSAckInterval = time.Duration(n) * time.Millisecond
			return nil
		}, public},
		{"MARCONI_WS_FRAMES_PER_SECOND", strconv.Itoa(hub.DefaultWSFramesPerSecond), "frames a client may send per connection and second (burst twice it); past it the hub closes with 1008", func(c *Config, v string) error {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil || n <= 0 {
				return fmt.Errorf("want a positive number, got %q", v)
			}
			c.Hub.WSFramesPerSecond = n
			return nil
		}, public},
		{"MARCONI_MAX_CONNECTIONS", strconv.Itoa(hub.DefaultMaxConnections), "WebSockets open on this instance; past it an attach gets 429 quota_exceeded", positiveInt(&h.MaxConnections), public},
		{"MARCONI_MAX_CONNECTIONS_PER_ADDRESS", strconv.Itoa(hub.DefaultMaxConnectionsPerAddress), "WebSockets open from one client address (a load balancer in front counts as one); past it 429 quota_exceeded", positiveInt(&h.MaxConnectionsPerAddress), public},
		{"MARCONI_SEND_RATE_PER_SECOND", strconv.Itoa(hub.DefaultSendRatePerSecond), "per-session send limit (burst twice it)", positiveFloat(&h.SendRatePerSecond), public},
		{"MARCONI_QUOTA_SESSIONS_PER_PROJECT", strconv.Itoa(hub.DefaultQuotaSessionsPerProject), "live sessions per project (429 quota_exceeded past it)", positiveInt(&h.QuotaSessionsPerProject), public},
		{"MARCONI_QUOTA_ATTACHES_PER_SECOND", strconv.Itoa(hub.DefaultQuotaAttachesPerSecond), "WebSocket attaches per second per session, per instance (burst twice it); past it an attach gets 429 quota_exceeded before any store write", positiveFloat(&h.QuotaAttachesPerSecond), public},
		{"MARCONI_QUOTA_REGISTRATIONS_PER_SECOND", strconv.Itoa(hub.DefaultQuotaRegistrationsPerSecond), "registrations per second per API key, per instance (burst twice it)", positiveFloat(&h.QuotaRegistrationsPerSecond), public},
		{"MARCONI_REGISTRATION_RETRY_SECONDS", secs(hub.DefaultRegistrationRetry), "how long a registration's Idempotency-Key retries it after a lost answer, unless the token it made is used first", seconds(&h.RegistrationRetry), public},
		{"MARCONI_ALLOW_TAKEOVER", "true", "a registration with \"takeover\": true and the project's API key resumes a live session without its token: true or false", func(c *Config, v string) error {
			b, err := parseBool(v)
			c.Hub.NoTakeover = !b
			return err
		}, public},
		{"MARCONI_RECIPIENT_CACHE_MS", strconv.Itoa(int(signals.DefaultRecipientCacheAge / time.Millisecond)), "how long a recipient read by a send serves the next sends to it without a read (its registration, token and queue are checked by the append; its proof of life may be this old); 0 turns it off", cacheMillis(&h.RecipientCacheAge), public},
		{"MARCONI_RECIPIENT_CACHE_SIZE", strconv.Itoa(signals.DefaultRecipientCacheSize), "how many recipients the send path keeps read at most (MARCONI_RECIPIENT_CACHE_MS)", positiveInt(&h.RecipientCacheSize), public},
		{"MARCONI_IDEMPOTENCY_WINDOW_SECONDS", secs(signals.DefaultIdempotencyWindow), "how long a send's idempotency_key is remembered (a retry within it is the same call)", seconds(&h.IdempotencyWindow), public},
		{"MARCONI_RETAIN_ACKED_SECONDS", secs(hub.DefaultRetainAcked), "how long acknowledged signals are kept after they were made (also bounds idempotency)", seconds(&h.Retention.Acked), public},
		{"MARCONI_RETAIN_ACKED_PAYLOAD_BYTES", strconv.Itoa(pgstore.DefaultAckedPayloadBytes), "Postgres store: the largest payload an acknowledged signal keeps until pruned; a larger one is dropped by the ack (one more write per signal; the memory store drops every payload at the ack); 0: every payload is dropped at the ack", nonNegativeInt(&c.AckedPayloadBytes), public},
		{"MARCONI_RETAIN_EXPIRED_SECONDS", secs(hub.DefaultRetainExpired), "how long expired sessions are kept before pruning", seconds(&h.Retention.Expired), public},
		{"MARCONI_PRUNE_INTERVAL_SECONDS", secs(hub.DefaultPruneEvery), "how often the retention loop runs", seconds(&h.Retention.Every), public},
		{"MARCONI_PENDING_SWEEP_SECONDS", secs(hub.DefaultPendingSweep), "how often the attached queues are checked against the store and those with signals left are woken (bounds the delay of a lost cross-instance wake-up)", seconds(&h.PendingSweep), public},
		{"MARCONI_EXPIRY_CHECK_SECONDS", secs(hub.DefaultExpiryCheck), "how often this instance closes (4410) the WebSockets whose session has expired, once the store confirms it (bounds how long such a WebSocket outlives its session), and checks whether its store is on another history (a standby promoted: its WebSockets then write their unacknowledged signals again)", seconds(&h.ExpiryCheck), public},
		{"MARCONI_SHUTDOWN_TIMEOUT_SECONDS", secs(defaultShutdownTimeout), "bound on graceful shutdown", seconds(&c.ShutdownTimeout), public},
		{"MARCONI_QUOTA_PENDING_PER_RECIPIENT", strconv.Itoa(signals.DefaultQuotaPendingPerRecipient), "unacknowledged signals one recipient may hold (429 quota_exceeded past it)", positiveInt64(&h.StoreQuotas.PendingPerRecipient), public},
		{"MARCONI_QUOTA_PENDING_BYTES_PER_PROJECT", strconv.Itoa(signals.DefaultQuotaPendingBytesPerProject), "payload bytes of the unacknowledged signals of one project (429 quota_exceeded past it)", positiveInt64(&h.StoreQuotas.PendingBytesPerProject), public},
		{"MARCONI_TOKEN_CACHE_SIZE", strconv.Itoa(hub.DefaultTokenCacheSize), "session tokens the send path remembers, each for MARCONI_TOUCH_INTERVAL_SECONDS (0: off; the store still authorises every send)", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("want a whole number, 0 or more, got %q", v)
			}
			c.Hub.TokenCacheSize = n
			if n == 0 {
				c.Hub.TokenCacheSize = -1
			}
			return nil
		}, public},
		{"MARCONI_DATABASE_MAX_CONNS", strconv.Itoa(defaultDatabaseMaxConns), "Postgres connections of this instance's pool (the wake-up listener and the liveness connection hold two more)", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1000 {
				return fmt.Errorf("want a whole number from 1 to 1000, got %q", v)
			}
			c.DatabaseMaxConns = n
			return nil
		}, public},
		{"MARCONI_GROUP_COMMIT", "on", "gather concurrent durable sends, acks, heartbeats and attaches into one Postgres transaction (off: one per write, for comparison)", func(c *Config, v string) error {
			b, err := parseBool(v)
			c.GroupCommit = b
			return err
		}, public},
		{"MARCONI_GROUP_COMMIT_MAX_BATCH", strconv.Itoa(pgstore.DefaultMaxBatch), "most writes one group commit carries, and most wake-ups one NOTIFY statement sends (eight times as many may wait)", positiveInt(&c.GroupCommitMaxBatch), public},
		{"MARCONI_STORE_BATCHES_IN_FLIGHT", strconv.Itoa(pgstore.DefaultBatchesInFlight), "group commits running at once, each on a pooled connection (below MARCONI_DATABASE_MAX_CONNS); a session's writes are in one at a time, so they commit in arrival order", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxBatchesInFlight {
				return fmt.Errorf("want a whole number from 1 to %d, got %q", maxBatchesInFlight, v)
			}
			c.StoreBatchesInFlight = n
			return nil
		}, public},
		{"MARCONI_STORE_ACKS_PER_BATCH", strconv.Itoa(pgstore.DefaultAcksPerBatch), "acknowledgements one group commit carries beside sends and other writes, so that a burst of acks is spread over the next batches instead of holding one batch's sends; 0: no bound", nonNegativeInt(&c.StoreAcksPerBatch), public},
		{"MARCONI_STORE_QUOTA_LEASE_BYTES", strconv.Itoa(pgstore.DefaultQuotaLeaseBytes), "bytes of a project's pending-bytes room each group commit lane leases at a time, so that batches of one project commit side by side; 0: every batch locks its projects' counters", func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("want a whole number of bytes, 0 or more, got %q", v)
			}
			c.StoreQuotaLeaseBytes = n
			return nil
		}, public},
	}
}

// apiKeyRe is what a configured key must be to be presented as a bearer
// credential exactly as written: a header trims spaces and carries no
// control characters.
var apiKeyRe = regexp.MustCompile(`^[\x21-\x7e]{16,}$`)

func parseAPIKeys(v string) (map[string]hub.TenantProject, error) {
	keys := map[string]hub.TenantProject{}
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		key, owner, ok := strings.Cut(item, "=")
		tenant, project, ok2 := strings.Cut(owner, "/")
		if !ok || !ok2 || !apiKeyRe.MatchString(key) || !signals.ValidSessionID(tenant) || !signals.ValidSessionID(project) {
			return nil, fmt.Errorf("want key=tenant/project pairs: keys of at least 16 printable ASCII characters without spaces, tenant and project ids matching %s", signals.IDForm)
		}
		if _, dup := keys[key]; dup {
			// Two owners for one key: whichever won, one tenant would act as the other.
			return nil, fmt.Errorf("a key is listed twice (the one for %s/%s)", tenant, project)
		}
		keys[key] = hub.TenantProject{TenantID: tenant, ProjectID: project}
	}
	return keys, nil
}

// flagName is the kebab-case flag of an environment variable.
func flagName(env string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "MARCONI_")), "_", "-")
}

// boolSettings are the settings whose flag is a boolean (--selfheal alone is
// --selfheal=true).
var boolSettings = map[string]bool{"MARCONI_SELFHEAL": true}

// kind is what a setting's value is, as -h shows it. It is read from the
// variable's name and default so that a new setting needs no extra field.
func (s setting) kind() string {
	switch {
	case boolSettings[s.env]:
		return "bool"
	case strings.HasSuffix(s.env, "_SECONDS"):
		return "seconds"
	case strings.HasSuffix(s.env, "_BYTES"):
		return "bytes"
	case strings.HasSuffix(s.env, "_URL"):
		return "url"
	}
	if _, err := strconv.ParseInt(s.def, 10, 64); err == nil {
		return "int"
	}
	if _, err := strconv.ParseFloat(s.def, 64); err == nil {
		return "number"
	}
	return "string"
}

// settingFlag is one setting's flag: it keeps the raw text; the setting's
// own parser validates it, so a flag and its variable fail the same way.
type settingFlag struct {
	value string
	set   bool
	bool  bool
}

func (f *settingFlag) String() string { return f.value }

func (f *settingFlag) Set(v string) error {
	f.value, f.set = v, true
	return nil
}

// IsBoolFlag lets a boolean setting's flag stand alone (flag.boolFlag).
func (f *settingFlag) IsBoolFlag() bool { return f.bool }

// joinBoolValues turns "--selfheal false" into "--selfheal=false": the flag
// package reads a bare boolean flag as true and the next word as an
// argument, yet the two-word form worked while the flag took a string, and
// scripts use it. Only a word parseBool accepts is joined; the value of a
// flag that is not boolean is passed over, and "--" ends the flags.
func joinBoolValues(args []string, flags map[string]*settingFlag) []string {
	isBool := map[string]bool{}
	for env, f := range flags {
		isBool[flagName(env)] = f.bool
	}
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		name := strings.TrimLeft(a, "-")
		if a == "--" || !strings.HasPrefix(a, "-") {
			return append(out, args[i+1:]...) // the flag package stops here too
		}
		if strings.Contains(name, "=") || i+1 == len(args) {
			continue
		}
		boolean, known := isBool[name]
		switch _, err := parseBool(args[i+1]); {
		case boolean && err == nil:
			out[len(out)-1] = a + "=" + args[i+1]
			i++
		case known && !boolean:
			out = append(out, args[i+1]) // its value, whatever it looks like
			i++
		}
	}
	return out
}

// resolved is where one setting's effective value came from.
type resolved struct {
	setting
	value  string
	source string // flag, env or default
}

// LoadConfig reads the settings from flags (first), the environment, then
// defaults, and validates them. An error names the variable. With -h it
// prints every setting to out and returns flag.ErrHelp.
func LoadConfig(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	return loadConfig("serve", args, getenv, out)
}

// loadConfig is LoadConfig for the command cmd (serve, config, config
// check), whose usage -h prints above the settings.
func loadConfig(cmd string, args []string, getenv func(string) string, out io.Writer) (Config, error) {
	var c Config
	all := settings(&c)
	fs := flag.NewFlagSet("marconi "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned as one line, not printed with the usage
	flags := make(map[string]*settingFlag, len(all))
	for _, s := range all {
		def := s.def
		if def == "" {
			def = "none"
		}
		f := &settingFlag{bool: boolSettings[s.env]}
		flags[s.env] = f
		// A back-quoted word in the usage is the value's name in -h (and
		// stays in the text); a boolean flag shows none, as flag.Bool's do.
		kind := "`" + s.kind() + "`; "
		if f.bool {
			kind = "bool; "
		}
		fs.Var(f, flagName(s.env), fmt.Sprintf("%s (%senv %s, default %s)", s.help, kind, s.env, def))
	}
	if err := fs.Parse(joinBoolValues(args, flags)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(out, commandHelp(cmd))
			fmt.Fprintln(out, "\nEvery flag is also an environment variable (MARCONI_FOO_BAR is --foo-bar); a flag wins.")
			fs.SetOutput(out)
			fs.PrintDefaults()
			return c, err
		}
		return c, fmt.Errorf("%w (run 'marconi %s -h' for every setting)", flagError(fs, err), cmd)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q (settings are flags or MARCONI_* variables; run 'marconi help' for commands)", fs.Args())
	}
	value := func(env string) (string, string, bool) {
		if f := flags[env]; f.set && f.value != "" {
			return f.value, "flag", true
		}
		if v := getenv(env); v != "" {
			return v, "env", true
		}
		return "", "default", false
	}
	for _, s := range all {
		v, src, ok := value(s.env)
		if !ok {
			v = s.def
		}
		c.resolved = append(c.resolved, resolved{setting: s, value: v, source: src})
		if s.set == nil {
			continue
		}
		if err := s.set(&c, v); err != nil {
			return c, fmt.Errorf("%s: %w", s.env, err)
		}
	}
	if c.Addr == "" {
		// Development mode is for one machine: it listens on loopback
		// unless MARCONI_ADDR says otherwise.
		c.Addr = ":8080"
		if c.Hub.Mode == marconi.Development {
			c.Addr = "127.0.0.1:8080"
		}
		for i := range c.resolved {
			if c.resolved[i].env == "MARCONI_ADDR" {
				c.resolved[i].value = c.Addr
			}
		}
	}

	// Self-heal flag: MARCONI_SELFHEAL wins over its alias PRISM_MARCONI_SELFHEAL;
	// with neither, it follows the mode (on in development only).
	c.Hub.SelfHeal.Enabled = selfheal.DefaultEnabled(c.Hub.Mode)
	if v, _, ok := value("MARCONI_SELFHEAL"); ok {
		b, err := parseBool(v)
		if err != nil {
			return c, fmt.Errorf("MARCONI_SELFHEAL: %w", err)
		}
		c.Hub.SelfHeal.Enabled = b
	} else if v := getenv("PRISM_MARCONI_SELFHEAL"); v != "" {
		b, err := parseBool(v)
		if err != nil {
			return c, fmt.Errorf("PRISM_MARCONI_SELFHEAL: %w", err)
		}
		c.Hub.SelfHeal.Enabled = b
	}
	if err := c.Hub.SelfHeal.Validate(); err != nil {
		return c, err
	}
	if c.Hub.PublicURL == "" && c.DatabaseURL != "" && c.Hub.Mode != marconi.Development {
		// Sticky clients are sent to this URL by wrong_instance: a guessed
		// loopback address would strand them on other machines.
		return c, errors.New("MARCONI_PUBLIC_URL: required with MARCONI_DATABASE_URL in lan and cloud modes (clients are sent there by wrong_instance)")
	}
	if c.Hub.PublicURL == "" {
		port := c.Addr
		if i := strings.LastIndex(port, ":"); i >= 0 {
			port = port[i+1:]
		}
		c.Hub.PublicURL = "http://127.0.0.1:" + port
	}
	if c.BusURL != "" && c.DatabaseURL == "" {
		return c, errors.New("MARCONI_BUS_URL: needs MARCONI_DATABASE_URL (the embedded store is one instance: there is nobody to wake)")
	}
	if c.BusKey.Grace <= c.BusKey.Refresh {
		// An instance that has not yet read a rotation seals under the
		// previous key: the others must still open it.
		return c, fmt.Errorf("MARCONI_BUS_KEY_GRACE_SECONDS: must be longer than MARCONI_BUS_KEY_REFRESH_SECONDS (%v)", c.BusKey.Refresh)
	}
	if c.StoreBatchesInFlight > 1 && c.StoreBatchesInFlight >= c.DatabaseMaxConns {
		return c, fmt.Errorf("MARCONI_STORE_BATCHES_IN_FLIGHT: %d must be below MARCONI_DATABASE_MAX_CONNS (%d), which also serves a send's reads", c.StoreBatchesInFlight, c.DatabaseMaxConns)
	}
	if c.InstanceHeartbeat >= c.Hub.Fabric.DeadAfter {
		return c, fmt.Errorf("MARCONI_INSTANCE_HEARTBEAT_SECONDS: must be shorter than MARCONI_INSTANCE_DEAD_AFTER_SECONDS (%v)", c.Hub.Fabric.DeadAfter)
	}
	c.Hub.Fabric.HeartbeatEvery = c.InstanceHeartbeat
	if c.Hub.Mode == marconi.Development {
		if len(c.Hub.APIKeys) == 0 {
			c.generatedAPIKey = hub.NewAPIKey()
			c.Hub.APIKeys = map[string]hub.TenantProject{c.generatedAPIKey: {TenantID: "dev", ProjectID: "dev"}}
		}
		if c.Hub.AdminToken == "" {
			c.generatedAdminToken = hub.NewAdminToken()
			c.Hub.AdminToken = c.generatedAdminToken
		}
	}
	return c, nil
}

// checkDatabaseURL refuses a database URL that pgx would not connect with:
// a postgres:// URL or a keyword/value string (host=… dbname=…), as pgx
// parses them. The reason never quotes v, which may hold a password.
func checkDatabaseURL(v string) error {
	const want = "want a postgres:// URL or a keyword/value string (host=… dbname=…)"
	if migrations.IsURL(v) {
		if u, err := url.Parse(v); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return errors.New(want)
		}
	}
	if _, err := pgxpool.ParseConfig(v); err != nil {
		var pe *pgconn.ParseConfigError
		if !errors.As(err, &pe) {
			return errors.New(want)
		}
		bare := *pe
		bare.ConnString = ""
		msg := strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
		// A well-formed URL whose TLS files cannot be read here (a CA
		// file on another machine's path, say) is not a malformed URL.
		if cause, ok := strings.CutPrefix(msg, "failed to configure TLS ("); ok {
			return fmt.Errorf("its TLS settings (sslmode, sslrootcert, sslcert, sslkey) cannot be used on this machine: %s", strings.TrimSuffix(cause, ")"))
		}
		return fmt.Errorf("%s: %s", want, msg)
	}
	return nil
}
