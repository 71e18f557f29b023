package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/fabric/natsbus"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/migrations"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/breaker"
	"github.com/marconihub/marconi/sessionstore/memstore"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// Main is one running hub process: store, hub, HTTP listener and background
// loops. End-to-end tests start it in-process.
type Main struct {
	Config Config
	Stdout io.Writer
	Logger *slog.Logger

	store    sessionstore.Store
	natsBus  *natsbus.Bus // nil: wake-ups on Postgres NOTIFY (or none)
	hub      *hub.Server
	http     *http.Server
	listener net.Listener

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// NewMain returns a Main for cfg that prints its start-up lines to stdout.
func NewMain(cfg Config, stdout io.Writer) *Main {
	level := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}[cfg.LogLevel]
	return &Main{
		Config: cfg,
		Stdout: stdout,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
}

// Run opens the store, applies migrations, builds the hub and starts serving.
// It returns once the hub listens; Close stops it.
func (m *Main) Run(ctx context.Context) error {
	cfg := m.Config
	bg, cancel := context.WithCancel(context.Background())
	m.cancel = cancel

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoGauge(readBuildInfo()))

	storeName := "memory (nothing is durable; one instance only)"
	var bus fabric.Bus                     // nil: one instance, nobody to wake
	var schema func(context.Context) error // nil: the memory store has no schema
	var busKeys hub.BusKeys                // nil: the memory store has no bus key
	if cfg.DatabaseURL == "" {
		m.store = memstore.New()
	} else {
		st, err := pgstore.Open(ctx, cfg.DatabaseURL, pgstore.WithQueryTimeout(cfg.Hub.StoreTimeout),
			pgstore.WithGroupCommit(cfg.GroupCommit), pgstore.WithMaxBatch(cfg.GroupCommitMaxBatch),
			pgstore.WithBatchesInFlight(cfg.StoreBatchesInFlight),
			pgstore.WithQuotaLease(cfg.StoreQuotaLeaseBytes), pgstore.WithLeaseHolder(cfg.Hub.InstanceID),
			pgstore.WithAcksPerBatch(cfg.StoreAcksPerBatch),
			pgstore.WithAckedPayloadBytes(cfg.AckedPayloadBytes),
			pgstore.WithMaxConns(int32(cfg.DatabaseMaxConns)), pgstore.WithBusKeyTimings(cfg.BusKey), pgstore.WithRegisterer(reg))
		if err != nil {
			return fmt.Errorf("MARCONI_DATABASE_URL: %w", err)
		}
		m.store = st
		// Off the start's path: a store still unreachable must not hold
		// the listener up for a warning.
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			if w := st.AutovacuumWarning(bg); w != "" {
				m.Logger.Warn(w)
			}
		}()
		pb := pgstore.NewBus(st, m.Logger)
		bus, busKeys = pb, st
		if cfg.BusURL != "" {
			nb, err := natsbus.New(natsbus.Config{URL: cfg.BusURL, QueueSize: cfg.BusQueueSize, Name: "marconi " + cfg.Hub.InstanceID},
				pb, reg, m.Logger)
			if err != nil {
				st.Close()
				return fmt.Errorf("MARCONI_BUS_URL: %w", err)
			}
			bus, m.natsBus = nb, nb
			storeName = "postgres, wake-ups on NATS"
		}
		schema = schemaCheck(st)
		if m.natsBus == nil {
			storeName = "postgres"
		}
		if cfg.StoreBreaker {
			br, err := breaker.New(st, breaker.Config{ProbeEvery: cfg.StoreProbeEvery, ProbeTimeout: cfg.Hub.StoreTimeout}, reg, m.Logger)
			if err != nil {
				st.Close()
				return err
			}
			m.store = br
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				_ = br.Run(bg)
			}()
		}
	}
	h, err := hub.New(cfg.Hub, hub.Deps{Store: m.store, Registry: reg, Gatherer: reg, Logger: m.Logger, Bus: bus, Schema: schema, BusKeys: busKeys})
	if err != nil {
		return err
	}
	m.hub = h
	if cfg.DatabaseURL != "" {
		if cause := m.goMigrate(bg, cfg.DatabaseURL, schema); cause != "" {
			storeName = "postgres, NOT READY: " + cause + " (retrying every 2s; /readyz answers 503 until then)"
		}
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("MARCONI_ADDR: %w", err)
	}
	m.listener = ln
	// Bounds on one HTTP exchange, so a client trickling a body cannot hold a
	// goroutine forever. A WebSocket is unaffected: net/http clears the
	// deadlines when the connection is hijacked.
	m.http = &http.Server{
		Handler:           h.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ReadTimeout:       max(30*time.Second, 10*time.Second+cfg.Hub.BodyReadTimeout),
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	m.wg.Add(2)
	go func() {
		defer m.wg.Done()
		// hub.Listener answers net/http's own refusals in the error shape.
		if err := m.http.Serve(hub.Listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.Logger.Error("http server", "err", err)
		}
	}()
	go func() {
		defer m.wg.Done()
		if err := h.Run(bg); err != nil {
			m.Logger.Error("background loops", "err", err)
		}
	}()

	m.printBanner(storeName)
	return nil
}

// printBanner prints what the hub is and where, the credentials it made,
// and, in development, what to do next.
func (m *Main) printBanner(storeName string) {
	cfg, w := m.Config, m.Stdout
	selfHeal := "off"
	if cfg.Hub.SelfHeal.Enabled {
		selfHeal = "on"
	}
	fmt.Fprintf(w, "Marconi hub listening on %s (instance %s, store %s, mode %s, self-heal %s)\n",
		m.URL(), cfg.Hub.InstanceID, storeName, cfg.Hub.Mode, selfHeal)
	if cfg.generatedAPIKey != "" {
		fmt.Fprintf(w, "  dev API key (tenant dev, project dev): %s\n", cfg.generatedAPIKey)
	}
	if cfg.generatedAdminToken != "" {
		fmt.Fprintf(w, "  admin token: %s\n", cfg.generatedAdminToken)
	}
	if cfg.devCredentialsFile != "" {
		fmt.Fprintf(w, "  (development credentials kept in %s and reused at every start; delete it for new ones)\n", cfg.devCredentialsFile)
	}
	if host, _, err := net.SplitHostPort(cfg.Addr); err == nil && cfg.Hub.Mode == marconi.Development && (host == "127.0.0.1" || host == "localhost" || host == "::1") {
		port := m.listener.Addr().(*net.TCPAddr).Port
		fmt.Fprintf(w, "  listening on loopback only (development mode); MARCONI_ADDR=:%d listens on every interface\n", port)
	}
	fmt.Fprintf(w, "  dashboard: %s/ (sign in with the admin token)\n", m.URL())
	if cfg.Hub.Mode != marconi.Development {
		return
	}
	fmt.Fprintln(w, "Next steps:")
	fmt.Fprintln(w, "  marconi demo   the self-heal story with two agents, in one process (go run ./cmd/marconi demo)")
	key := "the API key above"
	if cfg.generatedAPIKey == "" {
		key = "a key of MARCONI_API_KEYS"
	}
	fmt.Fprintf(w, "  agents         connect them to %s with %s: docs/client.md (Go and Node)\n", m.URL(), key)
}

// buildInfoGauge is marconi_build_info: always 1, its labels say what runs.
func buildInfoGauge(b buildInfo) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "marconi_build_info",
		Help:        "Always 1; the labels are the build's module version, VCS revision and Go version (as marconi version prints them).",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}

// goMigrate applies the migrations, retrying in the background while they
// fail (Postgres unreachable, a dirty schema): until they are applied the hub
// answers 503 registry_unavailable and /readyz fails, naming the cause,
// rather than serving on a schema that is not there. It returns the cause of
// the first attempt's failure, or "" when the store is ready. schema names a
// schema that no migration of this binary can fix (ahead of it, dirty).
func (m *Main) goMigrate(ctx context.Context, url string, schema func(context.Context) error) string {
	last := ""
	attempt := func() string {
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err := migrations.Up(mctx, url)
		if err == nil {
			m.hub.SetStoreReady(true)
			return ""
		}
		// The class of failure goes to 503 answers and /readyz, the full
		// cause (the database's address) to the banner, the log and /readyz
		// asked with the admin token; a migration's own error (it may quote
		// SQL) stays in the log.
		cause := "schema migrations failing; the hub's log says why"
		public := cause
		if perr := m.store.Ping(mctx); perr != nil {
			public, cause = pgstore.Classify(perr), pgstore.Diagnose(perr)
			if d, ok := m.store.(interface {
				Diagnose(error) string
				Classify(error) string
			}); ok { // through the breaker: what opened it
				public, cause = d.Classify(perr), d.Diagnose(perr)
			}
		} else if sm := unfixable(mctx, schema); sm != nil {
			public, cause = sm.Class, sm.Detail
		}
		m.hub.SetStoreCause(public, cause)
		if cause != last { // once per cause, not every 2 s
			m.Logger.Warn("store not ready; retrying every 2s", "cause", cause, "err", err)
			last = cause
		}
		return cause
	}
	m.hub.SetStoreReady(false)
	first := attempt()
	if first == "" {
		return ""
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if attempt() == "" {
					m.Logger.Info("store ready: migrations applied")
					return
				}
			}
		}
	}()
	return first
}

// checkStore connects to the database once and names what is wrong, for
// `marconi config check`.
func checkStore(ctx context.Context, url string, timeout time.Duration) error {
	st, err := pgstore.Open(ctx, url, pgstore.WithQueryTimeout(timeout))
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Ping(ctx); err != nil {
		return errors.New(pgstore.Diagnose(err))
	}
	return nil
}

// URL is where the hub listens, as a client on this machine reaches it.
func (m *Main) URL() string {
	if m.listener == nil {
		return ""
	}
	addr := m.listener.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return fmt.Sprintf("http://%s", net.JoinHostPort(host, fmt.Sprint(addr.Port)))
}

// Close shuts down in order: draining (/readyz 503) → WebSockets closed with
// 1012 → HTTP server → background loops → store. It is idempotent.
func (m *Main) Close() error {
	var err error
	m.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), m.shutdownTimeout())
		defer cancel()
		if m.hub != nil {
			m.hub.SetDraining()
			err = errors.Join(err, m.hub.CloseConnections(ctx))
		}
		if m.http != nil {
			err = errors.Join(err, m.http.Shutdown(ctx))
		}
		if m.cancel != nil {
			m.cancel()
		}
		m.wg.Wait()
		if m.natsBus != nil {
			m.natsBus.Close()
		}
		if m.store != nil {
			err = errors.Join(err, m.store.Close())
		}
	})
	return err
}

func (m *Main) shutdownTimeout() time.Duration {
	if m.Config.ShutdownTimeout > 0 {
		return m.Config.ShutdownTimeout
	}
	return defaultShutdownTimeout
}
