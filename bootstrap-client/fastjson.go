package bootstrap

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/marconihub/marconi"
)

// The client decodes every send's answer and every signal frame, and
// encodes every send's body: the hub writes those in one plain shape
// (hub/sendanswer.go, hub/conns/frames.go), which these hand-written
// decoders read without encoding/json's reflection and its second pass
// over the input. Each reads only what it can read exactly as encoding/json
// would; at anything else (an escaped string, a key that differs from a
// field's only in case, a number json would refuse for an int64, pending
// signals) it says so and the caller decodes the same bytes with
// encoding/json. fastjson_test.go holds the two to the same result.

// jsonSpace reports whether c is JSON whitespace.
func jsonSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && jsonSpace(b[i]) {
		i++
	}
	return i
}

// stringEnd is the index after the closing quote of the string opening at
// b[i], escapes skipped (not checked); false when it is not closed.
func stringEnd(b []byte, i int) (int, bool) {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1, true
		}
	}
	return 0, false
}

// plainString is the content of the JSON string val when encoding/json
// would decode it to those very bytes: no escape, no control character,
// valid UTF-8.
func plainString(val []byte) ([]byte, bool) {
	if len(val) < 2 || val[0] != '"' || val[len(val)-1] != '"' {
		return nil, false
	}
	s := val[1 : len(val)-1]
	ascii := true
	for _, c := range s {
		if c < 0x20 || c == '"' || c == '\\' {
			return nil, false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	return s, ascii || utf8.Valid(s)
}

// valueEnd is the end of the JSON value that starts at b[i] (not checked:
// json.Valid does that where it matters).
func valueEnd(b []byte, i int) (int, bool) {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			j, ok := stringEnd(b, i)
			if !ok {
				return 0, false
			}
			if i = j; depth == 0 {
				return i, true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i, true
			}
			if depth--; depth == 0 {
				return i + 1, true
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i, true
			}
		}
		i++
	}
	return i, depth == 0
}

// eachMember calls member with the key and the value's bytes of every
// member of the JSON object b, in order, and reports whether b is one
// object that it read whole and member accepted every member. Keys must be
// plain strings (plainString).
func eachMember(b []byte, member func(key, val []byte) bool) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		end, ok := stringEnd(b, i)
		if !ok {
			return false
		}
		key, ok := plainString(b[i:end])
		if !ok {
			return false
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		vend, ok := valueEnd(b, i)
		if !ok || vend == i || !member(key, b[i:vend]) {
			return false
		}
		i = skipSpace(b, vend)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

var jsonNull = []byte("null")

// unknownMember accepts a member no field names: json ignores it, when it
// is valid JSON and its key matches no field (encoding/json matches keys
// to fields whatever their case; a key that is not ASCII may fold onto
// one too, so it is left to encoding/json).
func unknownMember(key, val []byte, fields []string) bool {
	for _, c := range key {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	for _, f := range fields {
		if bytes.EqualFold(key, []byte(f)) {
			return false
		}
	}
	return json.Valid(val)
}

// setString sets *dst to the string val, or leaves it on null, as
// encoding/json does. When *dst holds those bytes already it is left as it
// is, without allocating.
func setString(dst *string, val []byte) bool {
	if bytes.Equal(val, jsonNull) {
		return true
	}
	s, ok := plainString(val)
	if !ok {
		return false
	}
	if *dst != string(s) {
		*dst = string(s)
	}
	return true
}

// setInt64 sets *dst to the integer val, or leaves it on null. Only a
// JSON integer that fits is read here.
func setInt64(dst *int64, val []byte) bool {
	if bytes.Equal(val, jsonNull) {
		return true
	}
	digits := val
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || (digits[0] == '0' && len(digits) > 1) {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	n, err := strconv.ParseInt(string(val), 10, 64)
	if err != nil {
		return false
	}
	*dst = n
	return true
}

// setBool sets *dst to the boolean val, or leaves it on null.
func setBool(dst *bool, val []byte) bool {
	switch string(val) {
	case "true":
		*dst = true
	case "false":
		*dst = false
	case "null":
	default:
		return false
	}
	return true
}

// sendResponseFields are the keys sendResponse decodes.
var sendResponseFields = []string{"signal_id", "seq", "delivery", "recipient_route_state", "recipient_instance_url",
	"selfheal_outcome", "recipient_route_stale", "sender_route_stale", "duplicate", "pending", "history"}

// decodeSendResponse decodes a send's answer into r (which it resets).
func decodeSendResponse(data []byte, r *sendResponse) error {
	*r = sendResponse{}
	if fastSendResponse(data, r) {
		return nil
	}
	*r = sendResponse{}
	return json.Unmarshal(data, r)
}

func fastSendResponse(data []byte, r *sendResponse) bool {
	return eachMember(data, func(key, val []byte) bool {
		switch string(key) {
		case "signal_id":
			return setString(&r.SignalID, val)
		case "seq":
			return setInt64(&r.Seq, val)
		case "delivery":
			return setString((*string)(&r.Delivery), val)
		case "recipient_route_state":
			return setString((*string)(&r.RecipientRouteState), val)
		case "recipient_instance_url":
			return setString(&r.RecipientInstanceURL, val)
		case "selfheal_outcome":
			if bytes.Equal(val, jsonNull) {
				r.SelfhealOutcome = nil
				return true
			}
			var o string
			if !setString(&o, val) {
				return false
			}
			r.SelfhealOutcome = (*marconi.Outcome)(&o)
			return true
		case "recipient_route_stale":
			return setBool(&r.RecipientRouteStale, val)
		case "sender_route_stale":
			return setBool(&r.SenderRouteStale, val)
		case "duplicate":
			return setBool(&r.Duplicate, val)
		case "pending":
			switch {
			case bytes.Equal(val, jsonNull):
				r.Pending = nil
			case val[0] == '[' && skipSpace(val, 1) == len(val)-1:
				r.Pending = []Signal{}
			default:
				return false // signals came with it: encoding/json reads them
			}
			return true
		case "history":
			return setString(&r.History, val)
		}
		return unknownMember(key, val, sendResponseFields)
	})
}

// frameFields are the keys a signal frame decodes.
var frameFields = []string{"type", "id", "from_session", "to_session", "kind", "seq", "payload", "created_at", "history"}

// frameDecoder decodes the hub's frames on one connection. The sessions
// and kind of the last frame are kept, so that the frames of one sender
// share their strings rather than allocate each anew. Not safe for
// concurrent use: one reader owns it.
type frameDecoder struct {
	typ, from, to, kind string
}

// decode decodes one frame into f (which it resets).
func (d *frameDecoder) decode(data []byte, f *frame) error {
	*f = frame{}
	if d.fast(data, f) {
		return nil
	}
	*f = frame{}
	return json.Unmarshal(data, f)
}

func (d *frameDecoder) fast(data []byte, f *frame) bool {
	return eachMember(data, func(key, val []byte) bool {
		switch string(key) {
		case "type":
			return setInterned((*string)(&f.Type), &d.typ, val)
		case "id":
			return setString(&f.ID, val)
		case "seq":
			return setInt64(&f.Seq, val)
		case "from_session":
			return setInterned(&f.FromSession, &d.from, val)
		case "to_session":
			return setInterned(&f.ToSession, &d.to, val)
		case "kind":
			return setInterned(&f.Kind, &d.kind, val)
		case "payload":
			if bytes.Equal(val, jsonNull) || !json.Valid(val) {
				return false
			}
			f.Payload = append(json.RawMessage(nil), val...)
			return true
		case "created_at":
			if val[0] != '"' {
				return false
			}
			return f.CreatedAt.UnmarshalJSON(val) == nil
		case "history":
			return setString(&f.History, val)
		}
		return unknownMember(key, val, frameFields)
	})
}

// setInterned sets *dst to the string val as setString does, through
// *last: the string of the same bytes last time is reused.
func setInterned(dst, last *string, val []byte) bool {
	if bytes.Equal(val, jsonNull) {
		return true
	}
	if !setString(last, val) {
		return false
	}
	*dst = *last
	return true
}

// appendJSONString appends s as json.Marshal writes it.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always encodes
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// appendSendRequest appends r as json.Marshal writes it. r.Payload is
// json.Marshal's own output (compact, HTML escaped), which json.Marshal
// would write again as it is.
func appendSendRequest(dst []byte, r *sendRequest) []byte {
	dst = append(dst, `{"to_session":`...)
	dst = appendJSONString(dst, r.ToSession)
	if r.Kind != "" {
		dst = append(dst, `,"kind":`...)
		dst = appendJSONString(dst, r.Kind)
	}
	dst = append(dst, `,"payload":`...)
	if r.Payload == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, r.Payload...)
	}
	if r.IdempotencyKey != "" {
		dst = append(dst, `,"idempotency_key":`...)
		dst = appendJSONString(dst, r.IdempotencyKey)
	}
	return append(dst, '}')
}
