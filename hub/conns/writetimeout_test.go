package conns_test

import (
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// A recipient that stops reading stalls the writer once the socket's
// buffers are full: past MARCONI_WS_WRITE_TIMEOUT the hub ends the
// connection (connection_lost), and every signal stays in the store.
func TestStalledReaderIsClosedByTheWriteTimeout(t *testing.T) {
	st := memstore.New()
	h := hubtest.Start(t, hubtest.Options{Store: st, Config: hub.Config{
		WSWriteTimeout: 100 * time.Millisecond, WSQueueSize: 1 << 16,
		SendRatePerSecond: 1e6, MaxPayloadBytes: 256 << 10,
	}})
	bob := register(t, h, "bob")
	alice := register(t, h, "alice")
	c := dial(t, h, bob)
	if w := read(t, c); w["type"] != "welcome" {
		t.Fatalf("first frame %v", w)
	}
	// bob reads nothing more. Large signals fill the socket's buffers on
	// both sides until a write blocks and the write timeout ends it.
	payload := map[string]any{"blob": strings.Repeat("x", 200<<10)}
	sent := 0
	deadline := time.Now().Add(20 * time.Second)
	for connections(t, h) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still attached after %d signals of 200 KiB that bob never read", sent)
		}
		post(t, h.URL+"/v1/signals", alice, map[string]any{"to_session": "bob", "kind": "k", "payload": payload})
		sent++
	}
	waitFor(t, "the disconnect to be counted", func() bool {
		return metricOr0(t, h, "marconi_ws_disconnects_total", "reason", "connection_lost") == 1
	})
	if p := pending(t, st, "bob"); p != sent {
		t.Fatalf("%d pending after the disconnect, want all %d sent", p, sent)
	}
}

// connections is the hub's marconi_ws_connections gauge.
func connections(t *testing.T, h *hubtest.Hub) float64 {
	t.Helper()
	mfs, err := h.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "marconi_ws_connections" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no marconi_ws_connections")
	return 0
}

// metricOr0 is metric, with 0 for a series not yet counted.
func metricOr0(t *testing.T, h *hubtest.Hub, name, label, value string) float64 {
	t.Helper()
	mfs, err := h.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == name && l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
