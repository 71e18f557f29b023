package conns

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
)

// Buffer sizes of an attached connection. net/http hands a hijacked
// connection over with its 4 KiB read and 4 KiB write buffers, which an idle
// connection keeps for its whole life; frames of this protocol are small
// (acks in, signals out), and larger ones pass the buffer by.
const (
	readBufferSize  = 1024
	writeBufferSize = 2048
)

// leanHijack hands the upgrade smaller buffers than net/http's: the ones
// net/http allocated are released once the upgrade is done.
type leanHijack struct{ http.ResponseWriter }

// Hijack implements http.Hijacker.
func (w leanHijack) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("conns: the response writer cannot be hijacked")
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	if err := brw.Writer.Flush(); err != nil {
		c.Close()
		return nil, nil, err
	}
	var r io.Reader = c
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		r = io.MultiReader(bytes.NewReader(bytes.Clone(b)), c)
	}
	return c, bufio.NewReadWriter(bufio.NewReaderSize(r, readBufferSize), bufio.NewWriterSize(c, writeBufferSize)), nil
}
