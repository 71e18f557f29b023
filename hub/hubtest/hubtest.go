// Package hubtest starts a real hub in-process for tests: an httptest server
// in front of hub.Server, on the in-memory store by default or any store the
// test gives, with an injectable clock. Tests of the client, the dashboard and
// the end-to-end scenarios drive it over HTTP and WebSocket like any user.
package hubtest

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// Clock is a settable clock for tests. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock set to t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Options configure Start. Zero values mean: in-memory store, real clock,
// development mode with self-heal on, one API key for tenant "t1" project "p1".
type Options struct {
	// Config is the hub configuration; Start fills the API key, admin token
	// and instance id when they are empty.
	Config hub.Config
	// Store is the store; nil means a fresh memstore.
	Store sessionstore.Store
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil logs at warn level to stderr when MARCONI_TEST_LOG is set, else nowhere.
	Logger *slog.Logger
	// Bus carries wake-ups to other hubs on the same store (pgstore.NewBus);
	// nil means none.
	Bus fabric.Bus
	// BusKeys is the store's bus key (a *pgstore.Store) for the
	// /v1/ops/bus_key routes; nil means none.
	BusKeys hub.BusKeys
}

// Hub is a running in-process hub.
type Hub struct {
	// URL is the hub's base URL, e.g. http://127.0.0.1:34567.
	URL string
	// APIKey is a key for tenant t1, project p1.
	APIKey string
	// AdminToken guards /v1/ops/*.
	AdminToken string
	Server     *hub.Server
	Store      sessionstore.Store
	Registry   *prometheus.Registry

	http   *httptest.Server
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Start starts a hub and stops it when the test ends.
func Start(t testing.TB, o Options) *Hub {
	t.Helper()
	if o.Store == nil {
		o.Store = memstore.New()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
		if os.Getenv("MARCONI_TEST_LOG") != "" {
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	}
	cfg := o.Config
	h := &Hub{Store: o.Store, Registry: prometheus.NewRegistry(), done: make(chan struct{})}
	if cfg.APIKeys == nil {
		h.APIKey = hub.NewAPIKey()
		cfg.APIKeys = map[string]hub.TenantProject{h.APIKey: {TenantID: "t1", ProjectID: "p1"}}
	} else {
		for k := range cfg.APIKeys {
			h.APIKey = k
			break
		}
	}
	if cfg.AdminToken == "" {
		cfg.AdminToken = hub.NewAdminToken()
	}
	h.AdminToken = cfg.AdminToken
	if cfg.InstanceID == "" {
		cfg.InstanceID = "test-1"
	}
	h.http = httptest.NewUnstartedServer(nil)
	h.URL = "http://" + h.http.Listener.Addr().String()
	if cfg.PublicURL == "" {
		cfg.PublicURL = h.URL
	}
	srv, err := hub.New(cfg, hub.Deps{Store: o.Store, Registry: h.Registry, Gatherer: h.Registry, Logger: o.Logger, Now: o.Now, Bus: o.Bus, BusKeys: o.BusKeys})
	if err != nil {
		t.Fatalf("hubtest: %v", err)
	}
	h.Server = srv
	h.http.Config.Handler = srv.Handler()
	h.http.Config.MaxHeaderBytes = hub.DefaultMaxHeaderBytes
	h.http.Listener = hub.Listener(h.http.Listener)
	h.http.Start()
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		_ = srv.Run(ctx)
	}()
	t.Cleanup(h.Close)
	return h
}

// Close stops the hub as a SIGTERM would: draining, WebSockets closed with
// 1012, the HTTP server and the background loops stopped. The store is left
// open (the test owns it). Close is idempotent.
func (h *Hub) Close() {
	h.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.Server.SetDraining()
		_ = h.Server.CloseConnections(ctx)
		h.http.CloseClientConnections()
		h.http.Close()
		h.cancel()
		<-h.done
	})
}

// WSURL is the hub's WebSocket endpoint.
func (h *Hub) WSURL() string { return "ws" + h.URL[len("http"):] + "/v1/ws" }
