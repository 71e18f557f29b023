package hub

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
)

// decodeBody reads the request body as exactly one JSON object into v, with
// at most limit bytes. It answers invalid_json for anything that is not one
// object, invalid_field (naming the field) for a wrong type, and
// payload_too_large past the limit.
func decodeBody(c echo.Context, limit int64, v any) error {
	body, err := objectBody(c, limit)
	if err != nil {
		return err
	}
	return decodeObject(body, v)
}

// decodeSendBody is decodeBody for a send: one in its plain form decodes
// by hand (decodeSendRequest), and req stays off the heap.
func decodeSendBody(c echo.Context, limit int64, req *sendRequest) error {
	body, err := objectBody(c, limit)
	if err != nil {
		return err
	}
	if decodeSendRequest(body, req) {
		return nil
	}
	var v sendRequest
	if err := decodeObject(body, &v); err != nil {
		return err
	}
	*req = v
	return nil
}

// objectBody reads the request body, at most limit bytes, and checks that
// it starts as a JSON object.
func objectBody(c echo.Context, limit int64) ([]byte, error) {
	body, err := limitedBody(c, limit)
	if err != nil {
		return nil, err
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil, marconi.Errorf(marconi.CodeInvalidJSON, "the body must be one JSON object")
	}
	return body, nil
}

// decodeObject decodes body, trimmed, into v as decodeBody documents. One
// object alone, the common case, decodes without a Decoder and its
// buffers; anything else takes decodeStrict, which words the error.
func decodeObject(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err == nil {
		return nil
	}
	return decodeStrict(body, v)
}

// decodeStrict decodes body, one JSON object with nothing after it, into v
// with a Decoder, and words what is wrong with it as decodeBody documents.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
			return marconi.Errorf(marconi.CodeInvalidField, "field %s: expected %s, got %s", te.Field, te.Type.Kind(), te.Value)
		}
		return marconi.Errorf(marconi.CodeInvalidJSON, "the body is not valid JSON: %v", err)
	}
	if dec.More() {
		return marconi.Errorf(marconi.CodeInvalidJSON, "the body must be one JSON object, with nothing after it")
	}
	if _, err := dec.Token(); err != io.EOF {
		return marconi.Errorf(marconi.CodeInvalidJSON, "the body must be one JSON object, with nothing after it")
	}
	return nil
}

// limitedBody reads the request body, at most limit bytes; a body that
// readBody has read already is taken without a copy.
func limitedBody(c echo.Context, limit int64) ([]byte, error) {
	if bb, ok := c.Request().Body.(*bufferedBody); ok {
		if body, ok := bb.take(); ok {
			if int64(len(body)) > limit {
				return nil, marconi.Errorf(marconi.CodePayloadTooLarge, "request body is larger than %d bytes", limit)
			}
			return body, nil
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), c.Request().Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, marconi.Errorf(marconi.CodePayloadTooLarge, "request body is larger than %d bytes", limit)
		}
		return nil, marconi.Errorf(marconi.CodeInvalidJSON, "could not read the request body")
	}
	return body, nil
}
