package hub

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
)

// envelopeBytes is what a send body may carry besides its payload.
const envelopeBytes = 16 << 10

// maxBodyBytes is the largest body any endpoint takes (a send with the
// largest payload); each handler applies its own, smaller limit on top.
func (s *Server) maxBodyBytes() int64 {
	return int64(s.signals.Config().MaxPayloadBytes) + envelopeBytes
}

// readBody reads the whole request body into memory once the credential is
// checked and before the handler's store calls (withBody), within
// BodyReadTimeout and at most maxBodyBytes, so that the store deadline
// measures the store alone: a client on a slow link is never reported as a
// store outage. A body slower than the bound is 408 request_timeout.
func (s *Server) readBody(c echo.Context) error {
	req := c.Request()
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	rc := http.NewResponseController(c.Response())
	// Without support (never the case with net/http), the server's own
	// ReadTimeout still bounds the read.
	hasDeadline := rc.SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout)) == nil
	body, err := readAtMost(c.Response(), req, s.maxBodyBytes())
	if hasDeadline {
		// Clear it: on a kept-alive connection it would bound the next request.
		_ = rc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		// The rest of the body is not coming (or not wanted): close the
		// connection after the answer. Otherwise net/http, to reuse the
		// connection, first reads what is left of a body that stalled, and
		// the answer waits on the client for ever.
		c.Response().Header().Set(echo.HeaderConnection, "close")
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return marconi.Errorf(marconi.CodePayloadTooLarge, "request body is larger than %d bytes", s.maxBodyBytes())
		}
		if isTimeout(err) {
			return marconi.Errorf(marconi.CodeRequestTimeout, "the request body did not arrive within %v", s.cfg.BodyReadTimeout)
		}
		return marconi.Errorf(marconi.CodeInvalidJSON, "could not read the request body")
	}
	// Read to its end: closed, net/http knows there is nothing left to
	// discard before the connection's next request (it would otherwise try,
	// through a reader it allocates).
	_ = req.Body.Close()
	// The request's state, when it has one, holds the body's reader: one
	// allocation less per request.
	var bb *bufferedBody
	if st := stateOf(c); st != nil {
		bb = &st.body
	} else {
		bb = new(bufferedBody)
	}
	*bb = bufferedBody{b: body}
	req.Body = bb
	return nil
}

// readAtMost reads req's whole body, at most limit bytes; more is an
// *http.MaxBytesError. A body whose length the request declares (the usual
// case) is read into one buffer of that length, with no growing and no
// limiting reader; any other through http.MaxBytesReader.
func readAtMost(w http.ResponseWriter, req *http.Request, limit int64) ([]byte, error) {
	n := req.ContentLength
	if n < 0 {
		return io.ReadAll(http.MaxBytesReader(w, req.Body, limit))
	}
	if n > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	// One byte more of room: the read that must find the body's end reads
	// into it (a byte array of its own would escape, one allocation more).
	body := make([]byte, n, n+1)
	if _, err := io.ReadFull(req.Body, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // a body shorter than declared
		}
		return nil, err
	}
	// net/http never yields more than the declared length; a Body that
	// would is refused as too large rather than cut.
	if m, err := req.Body.Read(body[n : n+1]); m > 0 {
		return nil, &http.MaxBytesError{Limit: limit}
	} else if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return body, nil
}

// bufferedBody is a request body that readBody has read into memory:
// decodeBody takes its bytes as they are instead of copying them again.
type bufferedBody struct {
	b   []byte
	off int // how much of b has been read
}

func (b *bufferedBody) Read(p []byte) (int, error) {
	if b.off >= len(b.b) {
		return 0, io.EOF
	}
	n := copy(p, b.b[b.off:])
	b.off += n
	return n, nil
}

func (*bufferedBody) Close() error { return nil }

// take returns the whole body and leaves it read, unless some of it was
// read already.
func (b *bufferedBody) take() ([]byte, bool) {
	if b.off != 0 {
		return nil, false
	}
	b.off = len(b.b)
	return b.b, true
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}
