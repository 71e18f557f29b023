// Package natsbus is the wake-up bus between hub instances (fabric.Bus) on
// core NATS publish/subscribe, the option a fleet picks with MARCONI_BUS_URL
// instead of Postgres LISTEN/NOTIFY. Postgres stays the source of truth: a
// wake-up is a hint, carried best effort (no JetStream), and the holder's
// pending sweep delivers whatever a lost one left behind. The wake-ups are
// the Postgres bus's own payloads, a carried signal sealed under the
// database's bus key (pgstore.Bus.SealWakes), so a message that anyone
// able to publish on the NATS server forged carries nothing the hub pushes.
package natsbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/sessionstore"
)

// DefaultQueueSize is the default of Config.QueueSize.
const DefaultQueueSize = 8192

// Timings of the NATS connection.
const (
	// reconnectWait is how long the client waits between attempts to reach
	// the NATS server (plus up to reconnectJitter), for ever.
	reconnectWait   = 500 * time.Millisecond
	reconnectJitter = 500 * time.Millisecond
	// connectTimeout bounds one attempt to connect.
	connectTimeout = 2 * time.Second
	// flushTimeout bounds the round trip that makes sure the subscription is
	// in place on the server before the listener catches up.
	flushTimeout = 2 * time.Second
	// subjectPrefix starts every wake-up subject.
	subjectPrefix = "marconi.wake."
)

// Config configures a Bus.
type Config struct {
	// URL is the NATS server's URL (nats://host:4222; several, comma
	// separated, for a cluster). Required.
	URL string
	// QueueSize bounds the wake-ups received and not yet handed to the hub;
	// past it the NATS client drops them and the listener catches every
	// local queue up from the store. Zero means DefaultQueueSize.
	QueueSize int
	// Name is the client name the NATS server shows for this connection
	// (its monitoring pages); empty means "marconi".
	Name string
}

func (c Config) withDefaults() Config {
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.Name == "" {
		c.Name = "marconi"
	}
	return c
}

func (c Config) validate() error {
	if c.URL == "" {
		return errors.New("natsbus: no URL")
	}
	if c.QueueSize < 1 {
		return fmt.Errorf("natsbus: queue size %d, want at least 1", c.QueueSize)
	}
	return nil
}

// Store is what the bus needs of the Postgres store's own bus
// (pgstore.Bus): the wake-up codec under the database's bus key, the
// instance's channel name (the subject's last token, so deployments and
// schemas never hear each other), and its listener, which still holds the
// instance's liveness lock (fabric.Prober) and hears the NOTIFYs of
// instances not yet moved to NATS.
type Store interface {
	fabric.Bus
	fabric.Prober
	SealWakes(ctx context.Context, wakes []sessionstore.Wake) ([]string, error)
	OpenWakes(ctx context.Context, payload string) ([]sessionstore.Wake, error)
	Channel(ctx context.Context, instance string) (string, error)
}

// Bus is the NATS wake-up bus (fabric.Bus): Publish sends a wake-up to
// the subject of the instance it is for, Listen subscribes to this
// instance's subject. It also answers as the Prober of the store it wraps.
// It is safe for concurrent use; Close ends it.
type Bus struct {
	cfg   Config
	store Store
	log   *slog.Logger
	nc    *nats.Conn

	// events is signalled (never blocking) when the connection is made
	// again or a wake-up was dropped: the listener catches up.
	events chan struct{}

	subjects sync.Map // instance → subject

	refused      prometheus.Counter
	slowConsumer prometheus.Counter
	connected    prometheus.GaugeFunc
	disconnects  prometheus.Counter
}

var (
	_ fabric.Bus    = (*Bus)(nil)
	_ fabric.Prober = (*Bus)(nil)
)

// New returns a bus on the NATS server at cfg.URL, registering its metrics
// on reg. It does not wait for the server: while it is unreachable the
// client retries for ever, Publish returns an error and cross-instance
// signals arrive by the pending sweep. A nil log discards.
func New(cfg Config, store Store, reg prometheus.Registerer, log *slog.Logger) (*Bus, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, errors.New("natsbus: no store")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Bus{cfg: cfg, store: store, log: log, events: make(chan struct{}, 1)}
	b.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "marconi_nats_bus_refused_total",
		Help: "Messages on this instance's NATS wake-up subject that were not a well-formed wake-up, and were ignored.",
	})
	b.slowConsumer = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "marconi_nats_bus_slow_consumer_total",
		Help: "Times the NATS wake-up queue overflowed (MARCONI_BUS_QUEUE_SIZE) and wake-ups were dropped; each is followed by a catch-up of every local queue.",
	})
	b.disconnects = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "marconi_nats_bus_disconnects_total",
		Help: "Times the connection to the NATS server was lost; meanwhile cross-instance signals arrive by the pending sweep.",
	})
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.Timeout(connectTimeout),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ReconnectJitter(reconnectJitter, reconnectJitter),
		// No buffer while disconnected: a wake-up that cannot go now is
		// worth nothing later (the listener catches up when it is back), and
		// Publish says so at once.
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(func(*nats.Conn) { b.log.Info("wake-up bus connected to NATS"); b.signal() }),
		nats.ReconnectHandler(func(*nats.Conn) { b.log.Info("wake-up bus reconnected to NATS"); b.signal() }),
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if c.IsClosed() { // Close, at shutdown
				return
			}
			b.disconnects.Inc()
			b.log.Warn("wake-up bus lost NATS; reconnecting (signals meanwhile arrive by the pending sweep)", "err", err)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				b.slowConsumer.Inc()
				b.log.Warn("wake-up queue full: NATS dropped wake-ups; catching every local queue up from the store", "queue_size", cfg.QueueSize)
				b.signal()
				return
			}
			b.log.Warn("wake-up bus", "err", err)
		}),
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("natsbus: connect: %w", err)
	}
	b.nc = nc
	b.connected = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "marconi_nats_bus_connected",
		Help: "1 while this instance is connected to the NATS wake-up bus, else 0.",
	}, func() float64 {
		if nc.IsConnected() {
			return 1
		}
		return 0
	})
	for _, c := range []prometheus.Collector{b.refused, b.slowConsumer, b.disconnects, b.connected} {
		if err := reg.Register(c); err != nil {
			nc.Close()
			return nil, fmt.Errorf("natsbus: register metrics: %w", err)
		}
	}
	return b, nil
}

// Close closes the NATS connection; Publish fails and Listen returns after
// it. Call it once Listen has returned.
func (b *Bus) Close() { b.nc.Close() }

// Connected reports whether the bus is connected to the NATS server now.
func (b *Bus) Connected() bool { return b.nc.IsConnected() }

// signal tells the listener to catch up, without blocking.
func (b *Bus) signal() {
	select {
	case b.events <- struct{}{}:
	default:
	}
}

// subject is instance's wake-up subject: the prefix and the Postgres
// channel name of instance, read once.
func (b *Bus) subject(ctx context.Context, instance string) (string, error) {
	if s, ok := b.subjects.Load(instance); ok {
		return s.(string), nil
	}
	ch, err := b.store.Channel(ctx, instance)
	if err != nil {
		return "", err
	}
	s := subjectPrefix + ch
	b.subjects.Store(instance, s)
	return s, nil
}

// Publish implements fabric.Bus: it sends w, sealed as the Postgres bus
// seals it, to instance's subject. It returns an error when the NATS
// server is not reachable now (nothing is buffered) or the subject could
// not be read from the store.
func (b *Bus) Publish(ctx context.Context, instance string, w sessionstore.Wake) error {
	subject, err := b.subject(ctx, instance)
	if err != nil {
		return fmt.Errorf("publish wake-up: %w", err)
	}
	payloads, err := b.store.SealWakes(ctx, []sessionstore.Wake{w})
	if err != nil {
		return fmt.Errorf("publish wake-up: %w", err)
	}
	for _, p := range payloads {
		if err := b.nc.Publish(subject, []byte(p)); err != nil {
			return fmt.Errorf("publish wake-up on NATS: %w", err)
		}
	}
	return nil
}

// ConnectedInstances implements fabric.Prober through the store's bus,
// whose listener and liveness connections hold each process's liveness
// lock.
func (b *Bus) ConnectedInstances(ctx context.Context) (map[string]time.Time, string, error) {
	return b.store.ConnectedInstances(ctx)
}

// Listen implements fabric.Bus: it subscribes to instance's subject and
// hands every well-formed wake-up to onWake until ctx ends. Beside it runs
// the store's listener, which holds the process's liveness locks and hears
// NOTIFYs from instances still on the Postgres bus. onConnect runs when
// either starts listening, after a NATS reconnect, and after the queue
// overflowed. onWake and onConnect never run concurrently, and must not
// block for long.
func (b *Bus) Listen(ctx context.Context, instance string, startedAt time.Time, onWake func(sessionstore.Wake), onConnect func()) error {
	var mu sync.Mutex
	wake := func(w sessionstore.Wake) { mu.Lock(); defer mu.Unlock(); onWake(w) }
	connect := func() { mu.Lock(); defer mu.Unlock(); onConnect() }
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return b.store.Listen(gctx, instance, startedAt, wake, connect) })
	g.Go(func() error { return b.listen(gctx, instance, wake, connect) })
	return g.Wait()
}

// listen runs the NATS subscription until ctx ends. The subscription's
// channel is its bound: a message that finds it full is dropped by the
// client, which reports a slow consumer (see New).
func (b *Bus) listen(ctx context.Context, instance string, onWake func(sessionstore.Wake), onConnect func()) error {
	msgs := make(chan *nats.Msg, b.cfg.QueueSize)
	sub, subject, err := b.subscribe(ctx, instance, msgs)
	for err != nil { // the store not reachable yet, or the connection closed
		b.log.Warn("wake-up bus cannot subscribe; retrying (signals meanwhile arrive by the pending sweep)", "instance", instance, "err", err)
		t := time.NewTimer(reconnectWait + reconnectJitter)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		sub, subject, err = b.subscribe(ctx, instance, msgs)
	}
	defer func() { _ = sub.Unsubscribe() }()
	select { // a connect signalled before now is this catch-up's
	case <-b.events:
	default:
	}
	b.catchUp(onConnect)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-b.events:
			b.catchUp(onConnect)
		case m := <-msgs:
			wakes, err := b.store.OpenWakes(ctx, string(m.Data))
			if err != nil {
				b.refused.Inc()
				b.log.Warn("ignoring a malformed wake-up", "subject", subject, "err", err)
				continue
			}
			for _, w := range wakes {
				onWake(w)
			}
		}
	}
}

// subscribe subscribes msgs to instance's subject.
func (b *Bus) subscribe(ctx context.Context, instance string, msgs chan *nats.Msg) (*nats.Subscription, string, error) {
	subject, err := b.subject(ctx, instance)
	if err != nil {
		return nil, "", err
	}
	sub, err := b.nc.ChanSubscribe(subject, msgs)
	if err != nil {
		return nil, "", fmt.Errorf("subscribe %s: %w", subject, err)
	}
	return sub, subject, nil
}

// catchUp runs onConnect once the subscription is in place on the server
// (a round trip after it was sent), when connected; otherwise the next
// (re)connect signals again.
func (b *Bus) catchUp(onConnect func()) {
	if !b.nc.IsConnected() {
		return
	}
	if err := b.nc.FlushTimeout(flushTimeout); err != nil {
		b.log.Warn("wake-up bus: NATS did not answer; catching up at the next reconnect", "err", err)
		return
	}
	onConnect()
}
