package mcpbridge

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// readMetaKey marks, in a tool result's _meta, the take whose signals the
// answer returns, so that they are acknowledged once it is written.
const readMetaKey = "marconi/read"

// ackTransport wraps the MCP transport so that each answer carrying signals
// commits them once it is written, or gives them back when it could not be.
type ackTransport struct {
	mcp.Transport
	b *Bridge
}

func (t ackTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &ackConn{Connection: c, b: t.b}, nil
}

type ackConn struct {
	mcp.Connection
	b *Bridge
}

func (c *ackConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	token := readToken(msg)
	err := c.Connection.Write(ctx, msg)
	if token != 0 {
		if err != nil {
			c.b.inbox.abandon(token)
		} else {
			c.b.commit(token)
		}
	}
	return err
}

// readToken finds the take token in an answer's _meta; 0 when it has none.
func readToken(msg jsonrpc.Message) uint64 {
	r, ok := msg.(*jsonrpc.Response)
	if !ok || r.Error != nil || !bytes.Contains(r.Result, []byte(readMetaKey)) {
		return 0
	}
	var res struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(r.Result, &res) != nil {
		return 0
	}
	var token uint64
	if json.Unmarshal(res.Meta[readMetaKey], &token) != nil {
		return 0
	}
	return token
}

// commitOnReturn is the receiving middleware of the HTTP transport, where
// the bridge does not see the write: a tool answer's signals are committed
// once the handler returned it.
func (b *Bridge) commitOnReturn(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if r, ok := res.(*mcp.CallToolResult); ok && err == nil {
			if t, ok := r.Meta[readMetaKey].(uint64); ok && t != 0 {
				b.commit(t)
			}
		}
		return res, err
	}
}
