package hub

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"github.com/marconihub/marconi"
)

// Some requests never reach the hub's handler: net/http refuses them while
// reading the request head (headers past MaxHeaderBytes, bad header bytes,
// a duplicate Content-Length, an unknown transfer coding, a protocol
// version it does not speak) and writes a
// text/plain answer straight to the connection. Listener puts those answers
// in the hub's error shape on the way out.

// DefaultMaxHeaderBytes is MARCONI_MAX_HEADER_BYTES: the request line and
// headers a client may send. Every credential and header of the contract
// fits in far less; it bounds what an unauthenticated connection can make
// the hub hold (docs/security.md).
const DefaultMaxHeaderBytes = 16 << 10

// netHTTPErrorHeaders is what net/http writes after the status line of a
// refusal of its own, and nowhere else (an answer of a handler carries a
// Date and a length).
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// Listener wraps ln so that the refusals net/http writes by itself are
// answered in the error shape: 431 headers_too_large, 501 not_implemented,
// 505 http_version_not_supported, any other 400 bad_request, each with net/http's own (fixed) message. The
// http.Server serving the hub accepts on it.
func Listener(ln net.Listener) net.Listener { return shapeListener{ln} }

type shapeListener struct{ net.Listener }

func (l shapeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return shapeConn{c}, nil
}

// shapeConn rewrites net/http's own refusals; every other write passes as
// it is.
type shapeConn struct{ net.Conn }

func (c shapeConn) Write(b []byte) (int, error) {
	shaped, ok := shapeRefusal(b)
	if !ok {
		return c.Conn.Write(b)
	}
	if _, err := c.Conn.Write(shaped); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite lets net/http half-close the connection after a 431, as it
// does on a plain TCP connection.
func (c shapeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// shapeRefusal returns, when b is a refusal net/http wrote by itself, the
// same refusal in the error shape.
func shapeRefusal(b []byte) ([]byte, bool) {
	const proto = "HTTP/1.1 "
	if !bytes.HasPrefix(b, []byte(proto)) {
		return nil, false
	}
	line, rest, ok := bytes.Cut(b[len(proto):], []byte("\r\n"))
	if !ok || !bytes.HasPrefix(rest, []byte(netHTTPErrorHeaders[2:])) || len(line) < 3 {
		return nil, false
	}
	status, err := strconv.Atoi(string(line[:3]))
	if err != nil {
		return nil, false
	}
	code := marconi.CodeBadRequest
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		code = marconi.CodeHeadersTooLarge
	case http.StatusNotImplemented:
		code = marconi.CodeNotImplemented
	case http.StatusHTTPVersionNotSupported:
		code = marconi.CodeHTTPVersionNotSupported
	}
	msg := string(bytes.TrimSpace(rest[len(netHTTPErrorHeaders)-2:]))
	if len(msg) > 4 && msg[3] == ' ' && msg[:3] == string(line[:3]) {
		msg = msg[4:] // "400 Bad Request: invalid header name" → "Bad Request: ..."
	}
	body, err := json.Marshal(errorBody{Error: errorDetail{Code: code, Message: msg}})
	if err != nil {
		return nil, false
	}
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body), true
}
