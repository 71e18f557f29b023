package hub

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
)

// bodyTypes are the request bodies of every endpoint that reads one.
var bodyTypes = []func() any{
	func() any { return new(registerRequest) },
	func() any { return new(sendRequest) },
	func() any { return new(ackRequest) },
	func() any { return new(createKeyRequest) },
	func() any { return new(mismatchRequest) },
}

// FuzzDecodeBody: any body, read as any endpoint's request, either yields
// one of the three documented input errors or was exactly one valid JSON
// object whose decoded value survives encoding and decoding again; it never
// panics. Seeds: testdata/fuzz/FuzzDecodeBody (the first byte indexes
// bodyTypes: append, never reorder).
func FuzzDecodeBody(f *testing.F) {
	f.Add(uint8(1), `{"to_session":"bob","payload":{"a":[1,2]}}`)
	e := echo.New()
	f.Fuzz(func(t *testing.T, which uint8, body string) {
		c := e.NewContext(httptest.NewRequest("POST", "/", strings.NewReader(body)), httptest.NewRecorder())
		v := bodyTypes[int(which)%len(bodyTypes)]()
		err := decodeBody(c, 4096, v)
		if err != nil {
			if _, ok := errors.AsType[*marconi.Error](err); !ok {
				t.Fatalf("decodeBody(%q) = %v: not a *marconi.Error", body, err)
			}
			switch code := marconi.ErrorCode(err); code {
			case marconi.CodeInvalidJSON, marconi.CodeInvalidField, marconi.CodePayloadTooLarge:
			default:
				t.Fatalf("decodeBody(%q) = %v: code %s is not a documented input error", body, err, code)
			}
			return
		}
		trimmed := bytes.TrimSpace([]byte(body))
		if !json.Valid(trimmed) || trimmed[0] != '{' || len(body) > 4096 {
			t.Fatalf("decodeBody accepted %q, which is not one JSON object within the limit", body)
		}
		again := reflect.New(reflect.TypeOf(v).Elem()).Interface()
		raw, err := json.Marshal(v)
		if err == nil {
			err = json.Unmarshal(raw, again)
		}
		if err != nil || !reflect.DeepEqual(normalized(v), normalized(again)) {
			t.Fatalf("decodeBody(%q) = %+v; encoded %s it reads back %+v (%v)", body, v, raw, again, err)
		}
	})
}

// normalized writes a send's payload as the encoder does: compact, with
// <, > and & escaped, and an absent one as null (as the hub stores it).
func normalized(v any) any {
	if s, ok := v.(*sendRequest); ok {
		c := *s
		if len(s.Payload) == 0 {
			c.Payload = json.RawMessage("null")
			return &c
		}
		var compact, escaped bytes.Buffer
		if err := json.Compact(&compact, s.Payload); err == nil {
			json.HTMLEscape(&escaped, compact.Bytes())
			c.Payload = escaped.Bytes()
		}
		return &c
	}
	return v
}

// FuzzDecodeBodyStrict: decodeBody, which tries json.Unmarshal first, gives
// every body exactly what decodeStrict (the Decoder) gives it: the same
// value, or the same error code and message.
func FuzzDecodeBodyStrict(f *testing.F) {
	for _, s := range []string{
		`{"to_session":"bob","kind":"k","payload":{"a":[1,2]}}`,
		`{"to_session":"bob"} {"kind":"k"}`,
		`{"to_session":"bob"}}`,
		`{"to_session":1}`,
		`{"to_session":1} x`,
		`{"up_to_seq":99999999999999999999}`,
		`{"to_session":"bob",`,
		`{"payload":{"a":1}`,
	} {
		f.Add(uint8(1), s)
	}
	e := echo.New()
	f.Fuzz(func(t *testing.T, which uint8, body string) {
		c := e.NewContext(httptest.NewRequest("POST", "/", strings.NewReader(body)), httptest.NewRecorder())
		newV := bodyTypes[int(which)%len(bodyTypes)]
		got, want := newV(), newV()
		gotErr := decodeBody(c, 1<<20, got)
		trimmed := bytes.TrimSpace([]byte(body))
		if len(trimmed) == 0 || trimmed[0] != '{' {
			return // refused before either decoder runs
		}
		wantErr := decodeStrict(trimmed, want)
		if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Fatalf("body %q: decodeBody = %v, decodeStrict = %v", body, gotErr, wantErr)
		}
		if gotErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("body %q: decodeBody read %+v, decodeStrict %+v", body, got, want)
		}
	})
}
