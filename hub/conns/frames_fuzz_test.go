package conns_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// Two sentinels follow every fuzzed frame; their replies, invalid_json then
// invalid_field, mark where the fuzzed frame's reply (if any) ends.
var (
	sentinelJSON  = []byte(`not json`)
	sentinelField = []byte(`{"type":"marconi-fuzz-sentinel"}`)
)

// FuzzClientFrame writes hostile frames to a real attached WebSocket. Every
// frame is either accepted in silence, exactly when it is a frame of the
// contract (a ping, or an ack with a whole non-negative up_to_seq), or
// answered with exactly one error frame whose code is invalid_json or
// invalid_field; the connection stays up either way. The one exception is
// a text frame that is not UTF-8: it closes the connection with 1007, and
// the next input runs on a new one.
// Seeds: testdata/fuzz/FuzzClientFrame.
func FuzzClientFrame(f *testing.F) {
	// Past the frame rate the hub closes the connection, and past the
	// attach rate it refuses a new one, by design.
	h := hubtest.Start(f, hubtest.Options{Config: hub.Config{WSFramesPerSecond: 1e9, QuotaAttachesPerSecond: 1e9}})
	token := registerFuzz(f, h)
	ws := dialFuzz(f, h, token)
	f.Cleanup(func() { ws.CloseNow() })
	f.Add(false, []byte(`{"type":"ack","up_to_seq":1}`))
	f.Fuzz(func(t *testing.T, binary bool, frame []byte) {
		if len(frame) > 4096 {
			t.Skip("past the read limit the hub closes with 1009, by design")
		}
		typ := websocket.MessageText
		if binary {
			typ = websocket.MessageBinary
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if !binary && !utf8.Valid(frame) {
			if err := ws.Write(ctx, typ, frame); err != nil {
				t.Fatalf("write %q: %v", frame, err)
			}
			_, data, err := ws.Read(ctx)
			if websocket.CloseStatus(err) != websocket.StatusInvalidFramePayloadData {
				t.Fatalf("after the text frame %q that is not UTF-8: %s %v, want close 1007", frame, data, err)
			}
			ws.CloseNow()
			ws = dialFuzz(t, h, token)
			return
		}
		for _, w := range []struct {
			typ  websocket.MessageType
			data []byte
		}{{typ, frame}, {websocket.MessageText, sentinelJSON}, {websocket.MessageText, sentinelField}} {
			if err := ws.Write(ctx, w.typ, w.data); err != nil {
				t.Fatalf("write after %q: %v", frame, err)
			}
		}
		var codes []string
		for n := len(codes); n < 2 || codes[n-2] != "invalid_json" || codes[n-1] != "invalid_field"; n = len(codes) {
			_, data, err := ws.Read(ctx)
			if err != nil {
				t.Fatalf("the hub ended the connection after %q: %v", frame, err)
			}
			var e struct{ Type, Code, Message string }
			if err := json.Unmarshal(data, &e); err != nil || e.Type != "error" || e.Message == "" {
				t.Fatalf("after %q the hub sent %s, want an error frame", frame, data)
			}
			codes = append(codes, e.Code)
		}
		replies := codes[:len(codes)-2]
		switch {
		case len(replies) > 1:
			t.Fatalf("%q drew %d replies %v, want at most one", frame, len(replies), replies)
		case len(replies) == 1 && replies[0] != "invalid_json" && replies[0] != "invalid_field":
			t.Fatalf("%q drew %s, not an input error", frame, replies[0])
		case len(replies) == 0 && !validFrame(frame):
			t.Fatalf("%q was accepted in silence, but it is not a frame of the contract", frame)
		case len(replies) == 1 && validFrame(frame):
			t.Fatalf("%q is a frame of the contract, but drew %s", frame, replies[0])
		}
	})
}

// validFrame reports whether frame is one JSON object that is a ping, or an
// ack whose up_to_seq is a whole number from 0 to 2^63-1.
func validFrame(frame []byte) bool {
	trimmed := bytes.TrimSpace(frame)
	if !json.Valid(trimmed) || len(trimmed) == 0 || trimmed[0] != '{' {
		return false
	}
	var f struct {
		Type    string
		UpToSeq json.RawMessage `json:"up_to_seq"`
	}
	if json.Unmarshal(trimmed, &f) != nil {
		return false
	}
	if f.Type == "ping" {
		return true
	}
	if f.Type != "ack" || f.UpToSeq == nil {
		return false
	}
	n, err := strconv.ParseInt(string(f.UpToSeq), 10, 64)
	return err == nil && n >= 0
}

// registerFuzz registers the session the fuzz target attaches as.
func registerFuzz(tb testing.TB, h *hubtest.Hub) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", h.URL+"/v1/sessions", bytes.NewReader([]byte(`{"session_id":"fuzz","surface":"claude_code"}`)))
	req.Header.Set("Authorization", "Bearer "+h.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct{ Token string }
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusCreated {
		tb.Fatalf("register: %d %v", resp.StatusCode, err)
	}
	return r.Token
}

// dialFuzz attaches the session's WebSocket and reads its welcome; the
// caller closes it.
func dialFuzz(tb testing.TB, h *hubtest.Hub, token string) *websocket.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, h.WSURL(), &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		tb.Fatal(err)
	}
	if _, data, err := ws.Read(ctx); err != nil || !bytes.Contains(data, []byte(`"welcome"`)) {
		tb.Fatalf("welcome: %s %v", data, err)
	}
	return ws
}
