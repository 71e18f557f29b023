package breaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/sessionstore"
)

// ErrOpen is returned, without calling the store, while the breaker is
// open. It matches sessionstore.ErrUnavailable.
var ErrOpen = fmt.Errorf("breaker: the store timed out or was unreachable and no probe has reached it since: %w", sessionstore.ErrUnavailable)

// DefaultProbeEvery is how often an open breaker probes the store.
const DefaultProbeEvery = 500 * time.Millisecond

// Config configures a Store. Zero fields take the defaults.
type Config struct {
	// ProbeEvery is how often an open breaker pings the store
	// (MARCONI_STORE_PROBE_INTERVAL_MS, 500 ms).
	ProbeEvery time.Duration
	// ProbeTimeout bounds one probe (the store timeout, 3 s).
	ProbeTimeout time.Duration
}

func (c *Config) setDefaults() {
	if c.ProbeEvery <= 0 {
		c.ProbeEvery = DefaultProbeEvery
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 3 * time.Second
	}
}

// Store is a sessionstore.Store that fails fast while its store is
// unreachable. It is safe for concurrent use.
//
// It embeds the interface only so that a method added to sessionstore.Store
// keeps the build green; TestEveryMethodIsGuarded fails until the new method
// is written out here, so no method can bypass the breaker.
type Store struct {
	sessionstore.Store

	inner sessionstore.Store
	cfg   Config
	log   *slog.Logger
	m     *metrics

	open    atomic.Bool
	tripped chan struct{}         // one slot: wakes the probe loop
	cause   atomic.Pointer[error] // what opened the breaker, then the last failed probe
	// unreachable is set, while the breaker is open, once the store was
	// found unreachable (a call refused, or a probe that failed) rather
	// than merely slow (a call out of time); Ready reads it.
	unreachable atomic.Bool
}

var _ sessionstore.Store = (*Store)(nil)

type metrics struct {
	open      prometheus.Gauge
	trips     prometheus.Counter
	fastFails prometheus.Counter
}

// New wraps inner. Its metrics go to reg; nil registers nowhere.
func New(inner sessionstore.Store, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Store, error) {
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &metrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "marconi_store_breaker_open",
			Help: "1 while the store breaker is open: store calls fail at once until a probe reaches the store.",
		}),
		trips: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_store_breaker_trips_total",
			Help: "Times the store breaker opened after a store call timed out or found the store unreachable.",
		}),
		fastFails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marconi_store_breaker_rejections_total",
			Help: "Store calls refused at once by the open breaker, without waiting for the store.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.open, m.trips, m.fastFails} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return &Store{Store: inner, inner: inner, cfg: cfg, log: log, m: m, tripped: make(chan struct{}, 1)}, nil
}

// Open reports whether the breaker is open.
func (b *Store) Open() bool { return b.open.Load() }

// Run probes the store while the breaker is open (Reachable where the store
// has it, else Ping), and closes it when a probe succeeds. It returns when
// ctx ends.
func (b *Store) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-b.tripped:
		}
		for b.open.Load() {
			if b.probe(ctx) {
				b.unreachable.Store(false)
				b.open.Store(false)
				b.m.open.Set(0)
				b.log.Info("store reachable again: breaker closed")
				break
			}
			t.Reset(b.cfg.ProbeEvery)
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}

func (b *Store) probe(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ProbeTimeout)
	defer cancel()
	err := b.reach(ctx)
	if err != nil {
		b.cause.Store(&err)
		b.unreachable.Store(true)
	}
	return err == nil
}

// reachable is met by a store that can tell "gone" from "slow" better than
// Ping does (pgstore.Store.Reachable: Postgres answers even while every
// pooled connection is busy).
type reachable interface{ Reachable(context.Context) error }

// reach asks the wrapped store whether it answers at all: Reachable where it
// has one, else Ping.
func (b *Store) reach(ctx context.Context) error {
	if r, ok := b.inner.(reachable); ok {
		return r.Reachable(ctx)
	}
	return b.inner.Ping(ctx)
}

// Ready reports whether sending traffic to this instance helps, for
// /readyz: with the breaker closed, whether the store answers at all (see
// reach; a failure opens the breaker as any call's would); with it open,
// ErrOpen only once the store was found unreachable (a refused or reset
// connection, or a failed probe). A breaker opened by a call that ran out of
// time, and that no probe has yet found unreachable, is ready: the store may
// be answering slowly, every instance shares it, and taking them all out of
// a balancer at once would answer nobody (docs/operations.md).
func (b *Store) Ready(ctx context.Context) error {
	if !b.open.Load() {
		err := guardErr(b, ctx, func() error { return b.reach(ctx) })
		if err != nil && !errors.Is(err, ErrOpen) {
			b.unreachable.Store(true) // it was a probe, and it failed
		}
		return err
	}
	if b.unreachable.Load() {
		return ErrOpen
	}
	return nil
}

// HistoryToken is the wrapped store's (sessionstore.Historian), 0 and ""
// when it keeps none: a store that cannot go back in time.
func (b *Store) HistoryToken() (uint64, string) {
	if h, ok := b.inner.(sessionstore.Historian); ok {
		return h.HistoryToken()
	}
	return 0, ""
}

// witnessing is met by a store that keeps what its statements saw
// (pgstore.Store.Witness).
type witnessing interface {
	Witness() (sinceWrite time.Duration, failures uint64)
}

// Witness is the wrapped store's (pgstore.Store.Witness), for /readyz: its
// last accepted write and the calls that found it unavailable, the
// breaker's own refusals aside (what opened the breaker was counted as it
// failed). No write and no failure when the wrapped store keeps none.
func (b *Store) Witness() (sinceWrite time.Duration, failures uint64) {
	if w, ok := b.inner.(witnessing); ok {
		return w.Witness()
	}
	return -1, 0
}

// Diagnose says why the store cannot be used, for an operator: the wrapped
// store's own diagnosis (pgstore.Store.Diagnose) of err or, when err is
// ErrOpen, of what opened the breaker or of the last failed probe.
func (b *Store) Diagnose(err error) string {
	if d, ok := b.inner.(interface{ Diagnose(error) string }); ok {
		return d.Diagnose(b.underlying(err))
	}
	return b.underlying(err).Error()
}

// Classify is Diagnose for anyone (pgstore.Store.Classify: the class of
// failure, without the database's address, user or name); "" when the
// wrapped store cannot classify.
func (b *Store) Classify(err error) string {
	if d, ok := b.inner.(interface{ Classify(error) string }); ok {
		return d.Classify(b.underlying(err))
	}
	return ""
}

// underlying is err or, when err is ErrOpen, what opened the breaker or the
// last failed probe.
func (b *Store) underlying(err error) error {
	if errors.Is(err, ErrOpen) {
		if c := b.cause.Load(); c != nil {
			return *c
		}
	}
	return err
}

// before refuses the call while the breaker is open.
func (b *Store) before() error {
	if b.open.Load() {
		b.m.fastFails.Inc()
		return ErrOpen
	}
	return nil
}

// after opens the breaker when err says the store timed out or could not be
// reached. A caller that cancelled its own call says nothing about the store.
func (b *Store) after(ctx context.Context, err error) error {
	if err == nil || errors.Is(ctx.Err(), context.Canceled) {
		return err
	}
	if !errors.Is(err, sessionstore.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	// Out of time says the store is slow or gone; a refusal says it is gone.
	slow := errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded)
	if b.open.CompareAndSwap(false, true) {
		b.unreachable.Store(!slow)
		b.cause.Store(&err)
		b.m.trips.Inc()
		b.m.open.Set(1)
		b.log.Warn("store call timed out or store unreachable: breaker open, calls fail at once until a probe succeeds", "err", err)
		select {
		case b.tripped <- struct{}{}:
		default:
		}
	} else if !slow {
		b.unreachable.Store(true)
	}
	return err
}

// guard runs one store call through the breaker.
func guard[T any](b *Store, ctx context.Context, call func() (T, error)) (T, error) {
	if err := b.before(); err != nil {
		var zero T
		return zero, err
	}
	v, err := call()
	return v, b.after(ctx, err)
}

// guardErr is guard for calls that return only an error.
func guardErr(b *Store, ctx context.Context, call func() error) error {
	_, err := guard(b, ctx, func() (struct{}, error) { return struct{}{}, call() })
	return err
}
