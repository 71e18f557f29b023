//lint:file-ignore SA1019 API.md makes reconnects and self-heal events MCP log messages; the SDK deprecates logging from protocol 2026-07-28 but keeps it working for at least a year.

package mcpbridge

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// logQueue bounds the log messages waiting to go to the host; beyond it
// they are dropped (counted), never waited for: a host that does not read
// stdout must not stall the client's reconnects.
const logQueue = 64

// hostLogs forwards log records to every MCP session as log messages
// (notifications/message), from one goroutine. Safe for concurrent use.
type hostLogs struct {
	server  *mcp.Server
	queue   chan *mcp.LoggingMessageParams
	dropped atomic.Int64
}

func newHostLogs(server *mcp.Server) *hostLogs {
	return &hostLogs{server: server, queue: make(chan *mcp.LoggingMessageParams, logQueue)}
}

// run sends queued messages until ctx ends.
func (h *hostLogs) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-h.queue:
			for ss := range h.server.Sessions() {
				_ = ss.Log(ctx, p) // a session that went away is no one's concern here
			}
		}
	}
}

func (h *hostLogs) send(p *mcp.LoggingMessageParams) {
	select {
	case h.queue <- p:
	default:
		h.dropped.Add(1)
	}
}

// hostHandler is the slog.Handler that feeds hostLogs: records at info level
// and above become MCP log messages whose data is the message and its
// attributes.
type hostHandler struct {
	logs  *hostLogs
	attrs []slog.Attr
}

func (h hostHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h hostHandler) Handle(_ context.Context, r slog.Record) error {
	data := map[string]any{"msg": r.Message}
	for _, a := range h.attrs {
		data[a.Key] = a.Value.Resolve().Any()
	}
	r.Attrs(func(a slog.Attr) bool {
		v := a.Value.Resolve().Any()
		if err, ok := v.(error); ok {
			v = err.Error()
		}
		data[a.Key] = v
		return true
	})
	h.logs.send(&mcp.LoggingMessageParams{Logger: "marconi", Level: mcpLevel(r.Level), Data: data})
	return nil
}

func (h hostHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return h
}

func (h hostHandler) WithGroup(string) slog.Handler { return h }

func mcpLevel(l slog.Level) mcp.LoggingLevel {
	switch {
	case l >= slog.LevelError:
		return "error"
	case l >= slog.LevelWarn:
		return "warning"
	case l >= slog.LevelInfo:
		return "info"
	}
	return "debug"
}

// minLevel passes on the records of h at or above level.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.level && m.Handler.Enabled(ctx, l)
}

func (m minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{m.Handler.WithAttrs(as), m.level}
}

func (m minLevel) WithGroup(g string) slog.Handler { return minLevel{m.Handler.WithGroup(g), m.level} }
