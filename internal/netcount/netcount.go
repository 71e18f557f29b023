// Package netcount counts the writes of a test's connections. A client that
// buffers what it sends writes once per message batch: once per round trip
// for pgx, once per frame for a WebSocket, so the count tells how many it
// made.
package netcount

import (
	"context"
	"net"
	"sync/atomic"
)

// Dial returns a DialContext that dials as a net.Dialer does and counts in
// writes every Write of the connections it returns.
func Dial(writes *atomic.Int64) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return conn{Conn: c, writes: writes}, nil
	}
}

// conn counts its writes.
type conn struct {
	net.Conn
	writes *atomic.Int64
}

func (c conn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}
