package hub

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi/hub/conns"
)

// answerBufs holds the buffers send answers are encoded into. Buffers past
// maxPooledAnswer are left to the GC rather than kept.
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledAnswer = 4 << 10

// writeSendAnswer answers a send with a, the bytes c.JSON writes, without
// its reflection, its encoder and its copy of a. Answers the hand-written
// encoder does not write (a ?pretty one, one with pending signals, strings
// json escapes) go through c.JSON itself.
func writeSendAnswer(c echo.Context, a sendResponse) error {
	if c.Request().URL.RawQuery != "" || c.Echo().Debug || len(a.Pending) > 0 {
		return c.JSON(http.StatusOK, a)
	}
	bp := answerBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= maxPooledAnswer {
			answerBufs.Put(bp)
		}
	}()
	b, ok := appendSendAnswer((*bp)[:0], &a)
	*bp = b[:0]
	if !ok {
		return c.JSON(http.StatusOK, a)
	}
	return c.JSONBlob(http.StatusOK, b) // the response copies b before it returns
}

// appendSendAnswer appends a as a json.Encoder writes it (newline
// included) when it can write it byte for byte so: no pending signals and
// strings json writes unescaped; ok reports whether it did. sendanswer_test.go
// holds the two to the same bytes.
func appendSendAnswer(dst []byte, a *sendResponse) ([]byte, bool) {
	ok := len(a.Pending) == 0
	dst = append(dst, `{"signal_id":`...)
	dst, ok = conns.AppendPlainString(dst, a.SignalID, ok)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, a.Seq, 10)
	dst = append(dst, `,"delivery":`...)
	dst, ok = conns.AppendPlainString(dst, a.Delivery, ok)
	dst = append(dst, `,"recipient_route_state":`...)
	dst, ok = conns.AppendPlainString(dst, a.RecipientRouteState, ok)
	if a.RecipientInstanceURL != "" {
		dst = append(dst, `,"recipient_instance_url":`...)
		dst, ok = conns.AppendPlainString(dst, a.RecipientInstanceURL, ok)
	}
	dst = append(dst, `,"selfheal_outcome":`...)
	dst, ok = appendNullableString(dst, a.SelfhealOutcome, ok)
	if a.RecipientRouteStale {
		dst = append(dst, `,"recipient_route_stale":true`...)
	}
	if a.SenderRouteStale {
		dst = append(dst, `,"sender_route_stale":true`...)
	}
	dst = append(dst, `,"selfheal":{"recipient":`...)
	dst, ok = appendNullableString(dst, a.Selfheal.Recipient, ok)
	dst = append(dst, `,"sender":`...)
	dst, ok = appendNullableString(dst, a.Selfheal.Sender, ok)
	dst = append(dst, `},"duplicate":`...)
	dst = strconv.AppendBool(dst, a.Duplicate)
	if a.Pending == nil {
		dst = append(dst, `,"pending":null`...)
	} else {
		dst = append(dst, `,"pending":[]`...)
	}
	if a.History != "" {
		dst = append(dst, `,"history":`...)
		dst, ok = conns.AppendPlainString(dst, a.History, ok)
	}
	return append(dst, "}\n"...), ok
}

// appendNullableString appends *s as AppendPlainString does, or null.
func appendNullableString(dst []byte, s *string, ok bool) ([]byte, bool) {
	if s == nil {
		return append(dst, "null"...), ok
	}
	return conns.AppendPlainString(dst, *s, ok)
}
