package mcpbridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/marconihub/marconi/bootstrap-client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// InboxURI is the resource that lists the signals not yet read.
const InboxURI = "marconi://inbox"

// flushTimeout bounds the last acknowledgement sent while the bridge closes.
const flushTimeout = 5 * time.Second

// Bridge is one agent's MCP server, holding its session on the hub. New
// dials the hub; Serve or ServeHTTP runs MCP once; Close ends it. Safe for
// concurrent use.
type Bridge struct {
	cfg    Config
	log    *slog.Logger
	client *bootstrap.Client
	inbox  *inbox
	server *mcp.Server
	logs   *hostLogs

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the notifier, the log forwarder and the acker

	notify chan struct{} // cap 1: the inbox changed, tell subscribers

	ackMu   sync.Mutex
	ackNext *bootstrap.Signal // the newest ack not yet sent
	ackWake chan struct{}     // cap 1

	// stopped is why the client stopped for good, which every tool answers
	// as its error from then on (nil until then).
	stopped atomic.Pointer[stop]

	closeOnce sync.Once
	closeErr  error
}

// New checks cfg, builds the MCP server and dials the hub: the session is
// registered (or resumed from the state directory) and, but for a codex
// surface, attached when it returns.
func New(ctx context.Context, cfg Config) (*Bridge, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Bridge{
		cfg:     cfg,
		inbox:   newInbox(cfg.InboxSize),
		notify:  make(chan struct{}, 1),
		ackWake: make(chan struct{}, 1),
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.server = b.newServer()
	b.logs = newHostLogs(b.server)
	b.log = slog.New(slog.NewMultiHandler(cfg.Logger.Handler(), hostHandler{logs: b.logs}))
	b.wg.Add(3)
	go func() { defer b.wg.Done(); b.logs.run(b.ctx) }()
	go func() { defer b.wg.Done(); b.notifier() }()
	go func() { defer b.wg.Done(); b.acker() }()

	client, err := b.dial(ctx)
	if err != nil {
		b.inbox.close()
		b.cancel()
		b.wg.Wait()
		return nil, err
	}
	b.client = client
	reg := client.Registration()
	b.log.Info("marconi: MCP bridge on the hub", "session_id", reg.SessionID, "surface", reg.Surface,
		"runtime_mode", reg.RuntimeMode, "hub", client.HubURL())
	return b, nil
}

// clientConfig is the Go client's configuration for this bridge.
func (b *Bridge) clientConfig() bootstrap.Config {
	c := bootstrap.Config{
		HubURL:      b.cfg.HubURLs[0],
		HubURLs:     b.cfg.HubURLs[1:],
		APIKey:      b.cfg.APIKey,
		SessionID:   b.cfg.SessionID,
		Surface:     b.cfg.Surface,
		RuntimeMode: b.cfg.RuntimeMode,
		ClientID:    "marconi-mcp/" + b.cfg.Version,
		DeferAck:    true,
		OnSignal:    b.onSignal,
		OnAffinityReset: func() {
			b.log.Warn("marconi: the session's runtime-local state is gone (affinity reset or registered again)")
		},
		OnFatal: b.onFatal,
		Logger:  b.log,
	}
	return withState(c, b.cfg)
}

func (b *Bridge) dial(ctx context.Context) (*bootstrap.Client, error) {
	if b.cfg.piggybackOnly() {
		return bootstrap.DialPiggyback(ctx, b.clientConfig())
	}
	return bootstrap.Dial(ctx, b.clientConfig())
}

// onFatal records why the client stopped for good: from then on every tool
// answers it as an error, and read_signals hands out none of the signals the
// inbox still holds, which the hub delivers again to the session's holder.
func (b *Bridge) onFatal(err error) {
	st := stop{code: codeReplaced, message: "another connection took this session over: a second marconi mcp with the same " +
		"--session (a host that started it twice, or another host), or a --takeover; this server no longer sends or receives. " +
		"Stop one of the two, and give each agent its own --session"}
	var he *bootstrap.Error
	switch {
	case errors.Is(err, bootstrap.ErrReplaced):
	case errors.As(err, &he):
		st = stop{code: string(he.Code), message: "the hub refused this session for good (" + he.Message +
			"); this server no longer sends or receives: restart it"}
	default:
		st = stop{code: codeHubUnreachable, message: "the client stopped for good (" + err.Error() +
			"); this server no longer sends or receives: restart it"}
	}
	b.stopped.Store(&st)
	b.log.Error("marconi: "+st.message, "err", err)
}

// stop is a tool error: why the client stopped for good.
type stop struct{ code, message string }

// onSignal puts a signal from the client into the inbox, waiting while it is
// full, and wakes the subscribers.
func (b *Bridge) onSignal(s bootstrap.Signal) {
	if b.inbox.add(s) {
		select {
		case b.notify <- struct{}{}:
		default:
		}
	}
}

// notifier sends notifications/resources/updated for the inbox, one per
// wake-up (arrivals coalesce).
func (b *Bridge) notifier() {
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-b.notify:
			_ = b.server.ResourceUpdated(b.ctx, &mcp.ResourceUpdatedNotificationParams{URI: InboxURI})
		}
	}
}

// commit is called once the answer that returned the signals of token was
// written: they leave the inbox, and the hub is acknowledged as far as it
// may be.
func (b *Bridge) commit(token uint64) {
	s, ok := b.inbox.commit(token)
	if !ok {
		return
	}
	b.ackMu.Lock()
	b.ackNext = &s
	b.ackMu.Unlock()
	select {
	case b.ackWake <- struct{}{}:
	default:
	}
}

// acker sends the acknowledgements, newest first (they are cumulative), and
// the last one once more before it ends.
func (b *Bridge) acker() {
	for {
		select {
		case <-b.ctx.Done():
			ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
			b.sendAck(ctx)
			cancel()
			return
		case <-b.ackWake:
			b.sendAck(b.ctx)
		}
	}
}

func (b *Bridge) sendAck(ctx context.Context) {
	b.ackMu.Lock()
	s := b.ackNext
	b.ackNext = nil
	b.ackMu.Unlock()
	if s == nil || b.client == nil {
		return
	}
	if err := b.client.Ack(ctx, *s); err != nil {
		b.log.Warn("marconi: ack failed; the signals will come again", "up_to_seq", s.Seq, "err", err)
	}
}

// Serve runs MCP on t (stdio in production) until the host closes it or ctx
// ends. Answers that return signals are acknowledged on the hub once
// written.
func (b *Bridge) Serve(ctx context.Context, t mcp.Transport) error {
	err := b.server.Run(ctx, ackTransport{Transport: t, b: b})
	if ctx.Err() != nil || errors.Is(err, mcp.ErrConnectionClosed) {
		return nil
	}
	return err
}

// ServeHTTP serves MCP's streamable HTTP transport on cfg.HTTPAddr at /mcp
// until ctx ends. Over HTTP an answer's signals are acknowledged when the
// handler has built it, just before it is written.
func (b *Bridge) ServeHTTP(ctx context.Context, ready func(addr string)) error {
	b.server.AddReceivingMiddleware(b.commitOnReturn)
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return b.server }, nil))
	ln, err := net.Listen("tcp", b.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", b.cfg.HTTPAddr, err)
	}
	if a, ok := ln.Addr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
		b.log.Warn("marconi mcp: serving MCP on an address other machines may reach, and MCP here asks for no credential: "+
			"whoever reaches it acts as this agent; give --http a loopback address (127.0.0.1:PORT)", "addr", ln.Addr().String())
	}
	if ready != nil {
		ready(ln.Addr().String())
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-errc
	return nil
}

// Close ends the bridge: it stops taking signals, sends the last
// acknowledgement, and closes the client. The session stays registered until
// its TTL (a restarted host resumes it) unless Config.DeregisterOnExit.
// Idempotent.
func (b *Bridge) Close(ctx context.Context) error {
	b.closeOnce.Do(func() {
		b.inbox.close()
		b.cancel()
		b.wg.Wait()
		if b.cfg.DeregisterOnExit {
			if err := b.client.Deregister(ctx); err != nil {
				b.closeErr = err
				b.log.Warn("marconi: deregister failed; the session ends at its TTL", "err", err)
			} else {
				b.log.Info("marconi: session deregistered")
			}
		}
		_ = b.client.Close()
	})
	return b.closeErr
}
