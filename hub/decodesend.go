package hub

import (
	"encoding/json"
)

// decodeSendRequest decodes body into req when body is a send in its plain
// form: one object whose keys are exactly to_session, kind, payload and
// idempotency_key, each at most once, with string values of printable
// ASCII that need no escapes and a valid JSON payload. It reports whether
// it did; anything else is left to json.Unmarshal, which this matches value
// for value (FuzzDecodeSendRequest). It spares a send the reflection and
// the scanner's states: its only allocations are the strings. req.Payload
// is body's own bytes, not a copy: body must not be changed or reused
// while req is in use (a request's body is read into a buffer of its own,
// readBody, and never written again).
func decodeSendRequest(body []byte, req *sendRequest) bool {
	p := jsonCursor{b: body}
	var out sendRequest
	var seen [4]bool
	if !p.take('{') {
		return false
	}
	if !p.take('}') {
		for {
			key, ok := p.plainString()
			if !ok || !p.take(':') {
				return false
			}
			if !out.decodeField(&p, key, &seen) {
				return false
			}
			if p.take(',') {
				continue
			}
			if p.take('}') {
				break
			}
			return false
		}
	}
	p.space()
	if p.i != len(p.b) {
		return false
	}
	*req = out
	return true
}

// decodeField decodes the value of key at p into r, unless key is unknown
// or seen already.
func (r *sendRequest) decodeField(p *jsonCursor, key []byte, seen *[4]bool) bool {
	var dst *string
	var n int
	switch string(key) {
	case "to_session":
		dst, n = &r.ToSession, 0
	case "kind":
		dst, n = &r.Kind, 1
	case "idempotency_key":
		dst, n = &r.IdempotencyKey, 2
	case "payload":
		n = 3
	default:
		return false
	}
	if seen[n] {
		return false
	}
	seen[n] = true
	if dst == nil {
		raw, ok := p.value()
		if !ok {
			return false
		}
		r.Payload = raw[:len(raw):len(raw)] // an append copies rather than write over body
		return true
	}
	s, ok := p.plainString()
	if ok {
		*dst = string(s)
	}
	return ok
}

// jsonCursor walks a JSON text from i.
type jsonCursor struct {
	b []byte
	i int
}

// space skips JSON whitespace.
func (p *jsonCursor) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

// take skips whitespace and then c, if c is next; it reports whether it was.
func (p *jsonCursor) take(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// plainString reads a string of printable ASCII without escapes and
// returns its contents (a view of b).
func (p *jsonCursor) plainString() ([]byte, bool) {
	if !p.take('"') {
		return nil, false
	}
	start := p.i
	for ; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// value reads one valid JSON value and returns its bytes (a view of b).
func (p *jsonCursor) value() ([]byte, bool) {
	p.space()
	start := p.i
	depth := 0
	for p.i < len(p.b) {
		switch c := p.b[p.i]; c {
		case '"':
			if !p.skipString() {
				return nil, false
			}
			if depth == 0 {
				return p.valid(start)
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return p.valid(start)
			}
			depth--
			if depth == 0 {
				p.i++
				return p.valid(start)
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return p.valid(start)
			}
		}
		p.i++
	}
	return p.valid(start)
}

// valid returns b[start:i] if it is one valid JSON value.
func (p *jsonCursor) valid(start int) ([]byte, bool) {
	raw := p.b[start:p.i]
	return raw, len(raw) > 0 && json.Valid(raw)
}

// skipString moves past the string that starts at i, escapes included.
func (p *jsonCursor) skipString() bool {
	for p.i++; p.i < len(p.b); p.i++ {
		switch p.b[p.i] {
		case '\\':
			p.i++
		case '"':
			p.i++
			return true
		}
	}
	return false
}
