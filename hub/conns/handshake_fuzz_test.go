package conns_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/coder/websocket"
	"golang.org/x/net/http/httpguts"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub/conns"
)

// FuzzCheckHandshake: CheckHandshake refuses in the error shape's codes
// (426 upgrade_required, 400 invalid_field) and accepts exactly the
// handshakes that the WebSocket library then upgrades. One that it accepts
// and the library refuses would be refused in plain text after placement
// (issue 12, items 4 and 5); one that it refuses and the library accepts
// locks a valid client out. Seeds: testdata/fuzz/FuzzCheckHandshake.
func FuzzCheckHandshake(f *testing.F) {
	f.Add(true, "Upgrade", "websocket", "13", "dGhlIHNhbXBsZSBub25jZQ==", "", false)
	f.Fuzz(func(t *testing.T, http11 bool, connection, upgrade, version, key, extensions string, twoKeys bool) {
		r := httptest.NewRequest("GET", "/v1/ws", nil)
		if !http11 {
			r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.0", 1, 0
		}
		for name, v := range map[string]string{"Connection": connection, "Upgrade": upgrade,
			"Sec-WebSocket-Version": version, "Sec-WebSocket-Key": key, "Sec-WebSocket-Extensions": extensions} {
			if !httpguts.ValidHeaderFieldValue(v) {
				t.Skip("no server reads such a header")
			}
			if v != "" {
				r.Header.Set(name, v)
			}
		}
		if twoKeys {
			r.Header.Add("Sec-WebSocket-Key", key)
		}
		err := conns.CheckHandshake(r, http.Header{})
		if err != nil {
			var me *marconi.Error
			if !errors.As(err, &me) || (me.Code != marconi.CodeUpgradeRequired && me.Code != marconi.CodeInvalidField) {
				t.Fatalf("CheckHandshake(%v) = %v: not upgrade_required or invalid_field", r.Header, err)
			}
		}
		// The recorder cannot be hijacked: 501 means the library checked
		// the handshake and would have upgraded it.
		rec := httptest.NewRecorder()
		_, _ = websocket.Accept(rec, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if upgraded := rec.Code == http.StatusNotImplemented; upgraded != (err == nil) {
			t.Fatalf("headers %v (HTTP/1.1: %v): CheckHandshake says %v, the library answers %d %q", r.Header, http11, err, rec.Code, rec.Body)
		}
	})
}
