package conns

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// Signal is the wire form of a signal, in WebSocket frames and in HTTP
// answers alike.
type Signal struct {
	ID          string          `json:"id"`
	Seq         int64           `json:"seq"`
	FromSession string          `json:"from_session"`
	ToSession   string          `json:"to_session"`
	Kind        string          `json:"kind"`
	Payload     json.RawMessage `json:"payload"`
	CreatedAt   time.Time       `json:"created_at"`
}

// WireSignal is s in its wire form.
func WireSignal(s sessionstore.Signal) Signal {
	return Signal{ID: s.ID, Seq: s.Seq, FromSession: s.FromSession, ToSession: s.To.SessionID,
		Kind: s.Kind, Payload: s.Payload, CreatedAt: s.CreatedAt.UTC()}
}

// Welcome is the first frame of every attached connection.
type Welcome struct {
	Type          marconi.FrameType `json:"type"`
	SessionID     string            `json:"session_id"`
	InstanceID    string            `json:"instance_id"`
	Resumed       bool              `json:"resumed"`
	AffinityReset bool              `json:"affinity_reset"`
	Replayed      int               `json:"replayed"` // counted by the hub when it records the attach
	Dropped       *int              `json:"dropped,omitempty"`
	// History is the token of the store's history the connection's
	// signals are written under (sessionstore.Historian); omitted when the
	// store keeps none.
	History string `json:"history,omitempty"`
}

// historyFrame tells the client the store's new history before the
// connection writes its unacknowledged signals again (history.go).
type historyFrame struct {
	Type    marconi.FrameType `json:"type"`
	History string            `json:"history"`
}

type signalFrame struct {
	Type marconi.FrameType `json:"type"`
	Signal
}

type clientFrame struct {
	Type    marconi.FrameType `json:"type"`
	UpToSeq *int64            `json:"up_to_seq"`
}

type errorFrame struct {
	Type    marconi.FrameType `json:"type"`
	Code    marconi.Code      `json:"code"`
	Message string            `json:"message"`
}

// appendSignalFrame appends sig's "signal" frame to dst: the bytes
// json.Marshal makes of signalFrame, without its reflection and its copy.
// It writes only what it can write byte for byte as json.Marshal would
// (strings of plain printable ASCII, a payload that compacts without
// anything to escape, a time json can encode) and hands anything else to
// json.Marshal itself; frames_test.go holds the two to the same bytes.
func appendSignalFrame(dst []byte, sig sessionstore.Signal) ([]byte, error) {
	start := len(dst)
	dst = append(dst, `{"type":"signal","id":`...)
	ok := true
	dst, ok = AppendPlainString(dst, sig.ID, ok)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, sig.Seq, 10)
	dst = append(dst, `,"from_session":`...)
	dst, ok = AppendPlainString(dst, sig.FromSession, ok)
	dst = append(dst, `,"to_session":`...)
	dst, ok = AppendPlainString(dst, sig.To.SessionID, ok)
	dst = append(dst, `,"kind":`...)
	dst, ok = AppendPlainString(dst, sig.Kind, ok)
	dst = append(dst, `,"payload":`...)
	if ok {
		dst, ok = appendPlainJSON(dst, sig.Payload)
	}
	if ok {
		dst = append(dst, `,"created_at":"`...)
		if t, err := sig.CreatedAt.UTC().AppendText(dst); err == nil {
			dst = append(t, `"}`...)
		} else {
			ok = false // a year json cannot write: json.Marshal says so
		}
	}
	if ok {
		return dst, nil
	}
	b, err := json.Marshal(signalFrame{Type: marconi.FrameSignal, Signal: WireSignal(sig)})
	return append(dst[:start], b...), err
}

// AppendPlainString appends s quoted when json.Marshal would write it
// unescaped (printable ASCII without '"', '\\', '<', '>' or '&'); ok
// reports whether it did (and stays false once false). Hand-written
// encoders use it to write strings byte for byte as encoding/json does.
func AppendPlainString(dst []byte, s string, ok bool) ([]byte, bool) {
	if !ok {
		return dst, false
	}
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < 0x20 || b >= utf8.RuneSelf || b == '"' || b == '\\' || b == '<' || b == '>' || b == '&' {
			return dst, false
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"'), true
}

// appendPlainJSON appends raw compacted when json.Marshal would write it so
// (valid JSON with nothing json escapes for HTML: '<', '>', '&', U+2028,
// U+2029); ok reports whether it did. A nil raw is "null", as json.Marshal
// writes it.
func appendPlainJSON(dst []byte, raw json.RawMessage) ([]byte, bool) {
	if raw == nil {
		return append(dst, "null"...), true
	}
	buf := bytes.NewBuffer(dst)
	if err := json.Compact(buf, raw); err != nil {
		return dst, false
	}
	out := buf.Bytes()
	added := out[len(dst):]
	if bytes.ContainsAny(added, "<>&") || bytes.Contains(added, lineSep) || bytes.Contains(added, paraSep) {
		return dst, false
	}
	return out, true
}

var (
	lineSep = []byte("\u2028")
	paraSep = []byte("\u2029")
)

// ackPrefix is how the clients write an ack, up to its number.
const ackPrefix = `{"type":"ack","up_to_seq":`

// decodeClientFrame decodes a frame a client sent, as json.Unmarshal
// decodes it into a clientFrame. An ack written exactly as the clients
// write it ({"type":"ack","up_to_seq":N}, N of at most 18 digits without a
// leading zero) is read without encoding/json; anything else goes through
// json.Unmarshal itself. FuzzDecodeClientFrame holds the two to the same
// frame and the same verdict.
func decodeClientFrame(data []byte) (clientFrame, error) {
	if rest, ok := bytes.CutPrefix(data, []byte(ackPrefix)); ok {
		if n, ok := plainAckSeq(rest); ok {
			return clientFrame{Type: marconi.FrameAck, UpToSeq: &n}, nil
		}
	}
	var f clientFrame
	err := json.Unmarshal(data, &f)
	return f, err
}

// plainAckSeq reads b as a non-negative decimal of 1 to 18 digits, without
// a leading zero, followed by '}' and nothing else.
func plainAckSeq(b []byte) (int64, bool) {
	digits, ok := bytes.CutSuffix(b, []byte("}"))
	if !ok || len(digits) == 0 || len(digits) > 18 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	var n int64
	for _, d := range digits {
		if d < '0' || d > '9' {
			return 0, false
		}
		n = n*10 + int64(d-'0')
	}
	return n, true
}
