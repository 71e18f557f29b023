package hub_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/internal/metrictest"
	"github.com/marconihub/marconi/sessionstore/pgstore"
)

// rotateBusKey rotates the bus key through h's ops API and returns the new
// version.
func rotateBusKey(t *testing.T, h *hubtest.Hub) int64 {
	t.Helper()
	st, resp := call(t, "POST", h.URL+"/v1/ops/bus_key/rotate", h.AdminToken, nil)
	if st != http.StatusOK {
		t.Fatalf("rotate the bus key: %d %v", st, resp)
	}
	if resp["version"] != resp["instance_version"] {
		t.Fatalf("after its rotation %s seals with version %v, want the new %v", h.Server.InstanceID(), resp["instance_version"], resp["version"])
	}
	return int64(resp["version"].(float64))
}

// opened is how many carried signals reg's store opened with result
// (marconi_bus_key_opened_total).
func opened(t *testing.T, reg prometheus.Gatherer, result string) float64 {
	t.Helper()
	v, ok := metrictest.Lookup(t, reg, "marconi_bus_key_opened_total", "result", result)
	if !ok {
		t.Fatalf("no marconi_bus_key_opened_total{result=%q}", result)
	}
	return v
}

// TestBusKeyRotationOnALivePair rotates the bus key under two live
// instances whose key is re-read only when a carried signal fails to open
// (the timer is an hour away): a wake-up sealed under the old key after the
// rotation is opened and carried; the first one sealed under the new key
// before the other instance read it arrives bare and has the key read in
// the background, and the next is carried; one sealed under a key two
// rotations old is not, and its signal arrives from the store, in order,
// with no pending sweep to fall back on.
func TestBusKeyRotationOnALivePair(t *testing.T) {
	t.Parallel()
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	timings := pgstore.WithBusKeyTimings(pgstore.BusKeyTimings{Refresh: time.Hour, Grace: 2 * time.Hour, Recheck: time.Millisecond})
	p := startPair(t, pairOptions{sweepB: noSweep,
		storeA: []pgstore.Option{timings, pgstore.WithRegisterer(regA)},
		storeB: []pgstore.Option{timings, pgstore.WithRegisterer(regB)}})
	alice := register(t, p.a, "alice", "claude_code")
	bob := register(t, p.a, "bob", "claude_code")
	carol := register(t, p.a, "carol", "claude_code")
	cb, _ := dial(t, p.b, bob)   // bob's queue is on b
	cc, _ := dial(t, p.a, carol) // carol's on a

	// Both instances seal and open under the key migration 0008 made.
	send(t, p.a, alice, "bob", 1)
	send(t, p.b, alice, "carol", 1)
	xiWantSeqs(t, "before the rotation", first(xiSignals(t, cb, 1)), 1)
	xiWantSeqs(t, "before the rotation", first(xiSignals(t, cc, 1)), 1)
	if p.storeA.BusKeyInUse() != 1 || p.storeB.BusKeyInUse() != 1 {
		t.Fatalf("bus key versions in use %d and %d, want 1", p.storeA.BusKeyInUse(), p.storeB.BusKeyInUse())
	}

	if v := rotateBusKey(t, p.a); v != 2 {
		t.Fatalf("rotated to version %d, want 2", v)
	}
	// b has not read the rotation: it seals under the old key, which a
	// opens as the previous one.
	carriedA := metric(t, p.a, "marconi_wakeups_total", "result", "carried")
	send(t, p.b, alice, "carol", 2)
	xiWantSeqs(t, "sealed under the old key", first(xiSignals(t, cc, 1)), 2)
	if got := metric(t, p.a, "marconi_wakeups_total", "result", "carried"); got != carriedA+1 {
		t.Errorf("a carried %v signals sealed under the previous key, want 1", got-carriedA)
	}
	if got := opened(t, regA, "previous"); got != 1 {
		t.Errorf("a opened %v signals under the previous key, want 1", got)
	}
	// a seals under the new key, which b does not know yet: that signal
	// arrives from the store, and has b read the key again in the
	// background; the next one b opens.
	send(t, p.a, alice, "bob", 2)
	xiWantSeqs(t, "sealed under a key b has not read", first(xiSignals(t, cb, 1)), 2)
	waitFor(t, "b to read the rotated key", func() bool { return p.storeB.BusKeyInUse() == 2 })
	carriedB := metric(t, p.b, "marconi_wakeups_total", "result", "carried")
	send(t, p.a, alice, "bob", 3)
	xiWantSeqs(t, "sealed under the new key", first(xiSignals(t, cb, 1)), 3)
	if got := metric(t, p.b, "marconi_wakeups_total", "result", "carried"); got != carriedB+1 {
		t.Errorf("b carried %v signals sealed under the new key, want 1", got-carriedB)
	}
	if v, _ := metrictest.Lookup(t, regB, "marconi_bus_key_version"); v != 2 {
		t.Errorf("b's marconi_bus_key_version is %v, want 2", v)
	}
	if got := opened(t, regA, "none"); got != 0 {
		t.Errorf("%v signals to a fell back to the store during the rotation, want none", got)
	}
	if got := opened(t, regB, "none"); got != 1 {
		t.Errorf("%v signals to b fell back to the store during the rotation, want the one that had b read the key", got)
	}

	// Two more rotations on a, which b does not read: b seals under
	// version 2, two rotations old. Its signals are not carried; the
	// wake-ups still wake carol's queue, which reads them from the store,
	// in order with one sent on a itself after them.
	rotateBusKey(t, p.a)
	if v := rotateBusKey(t, p.a); v != 4 {
		t.Fatalf("rotated to version %d, want 4", v)
	}
	carriedA = metric(t, p.a, "marconi_wakeups_total", "result", "carried")
	for i := 3; i <= 5; i++ {
		send(t, p.b, alice, "carol", i)
	}
	send(t, p.a, alice, "carol", 6)
	seqs, payloads := xiSignals(t, cc, 4)
	xiWantSeqs(t, "sealed two rotations back", seqs, 3)
	for i, pl := range payloads {
		if pl != float64(i+3) {
			t.Fatalf("signal %d carries %v", i+3, pl)
		}
	}
	// Signal 6, pushed on a, has carol's writer catch 3 to 5 up from the
	// store, maybe before a has handled their wake-ups: wait for the count.
	waitFor(t, "a to count a signal sealed two rotations back as opened under no key", func() bool {
		return opened(t, regA, "none") >= 1
	})
	if got := metric(t, p.a, "marconi_wakeups_total", "result", "carried"); got != carriedA {
		t.Errorf("a carried %v signals sealed two rotations back, want none", got-carriedA)
	}
}

// first is the first of two results.
func first[A, B any](a A, _ B) A { return a }

// TestBusKeyPickedUpByAnIdleInstance: an instance that opens nothing seals
// with a rotated key within its refresh, on its listener's timer, and says
// so in marconi_bus_key_version.
func TestBusKeyPickedUpByAnIdleInstance(t *testing.T) {
	t.Parallel()
	regB := prometheus.NewRegistry()
	p := startPair(t, pairOptions{sweepB: noSweep,
		storeB: []pgstore.Option{pgstore.WithRegisterer(regB),
			pgstore.WithBusKeyTimings(pgstore.BusKeyTimings{Refresh: 200 * time.Millisecond, Grace: time.Hour})}})
	waitFor(t, "b reads the bus key", func() bool { return p.storeB.BusKeyInUse() == 1 })
	heartbeats(t, p.a, p.b)
	if got := summaryBusKeys(t, p.a); got["a"] != float64(1) || got["b"] != float64(1) {
		t.Fatalf("fabric summary's bus key versions before the rotation: %v, want 1 for both", got)
	}
	v := rotateBusKey(t, p.a)
	waitFor(t, "b seals with the rotated key", func() bool {
		got, _ := metrictest.Lookup(t, regB, "marconi_bus_key_version")
		return got == float64(v)
	})
	// The operator's check that the rotation reached every instance: the
	// fabric summary, on either instance, shows each one's version as its
	// last heartbeat wrote it.
	heartbeats(t, p.a, p.b)
	for _, h := range []*hubtest.Hub{p.a, p.b} {
		if got := summaryBusKeys(t, h); got["a"] != float64(v) || got["b"] != float64(v) {
			t.Errorf("fabric summary on %s after the rotation: bus key versions %v, want %d for both", h.Server.InstanceID(), got, v)
		}
	}
}

// heartbeats runs one fabric tick (a heartbeat and a refresh) on each of hs.
func heartbeats(t *testing.T, hs ...*hubtest.Hub) {
	t.Helper()
	for _, h := range hs {
		if err := h.Server.Fabric().Tick(t.Context()); err != nil {
			t.Fatalf("tick %s: %v", h.Server.InstanceID(), err)
		}
	}
}

// summaryBusKeys is each instance's bus_key_version in h's fabric summary,
// by instance id (nil when unknown).
func summaryBusKeys(t *testing.T, h *hubtest.Hub) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, in := range summary(t, h)["instances"].([]any) {
		in := in.(map[string]any)
		v, ok := in["bus_key_version"]
		if !ok {
			t.Fatalf("fabric summary instance %v has no bus_key_version", in)
		}
		out[in["instance_id"].(string)] = v
	}
	return out
}

// TestBusKeyOpsErrors: the bus key routes are the admin's; a hub without a
// bus key says so; the answer never holds the key.
func TestBusKeyOpsErrors(t *testing.T) {
	t.Parallel()
	p := startPair(t, pairOptions{sweepB: noSweep})
	alice := register(t, p.a, "alice", "claude_code")
	for _, tc := range []struct{ name, cred string }{{"none", ""}, {"API key", p.a.APIKey}, {"session token", alice.Token}, {"wrong admin token", "madm_nope"}} {
		for _, path := range []string{"/v1/ops/bus_key/rotate", "/v1/ops/bus_key"} {
			method := map[bool]string{true: "POST", false: "GET"}[path == "/v1/ops/bus_key/rotate"]
			st, resp := call(t, method, p.a.URL+path, tc.cred, nil)
			if st != http.StatusUnauthorized || errCode(resp) != "unauthorized" {
				t.Errorf("%s %s with %s: %d %v, want 401 unauthorized", method, path, tc.name, st, resp)
			}
		}
	}
	if p.storeA.BusKeyInUse() > 1 {
		t.Fatalf("a refused rotation rotated the key (version %d)", p.storeA.BusKeyInUse())
	}
	st, resp := call(t, "GET", p.a.URL+"/v1/ops/bus_key", p.a.AdminToken, nil)
	if st != http.StatusOK || resp["version"] != float64(1) || len(resp) != 5 {
		t.Fatalf("GET /v1/ops/bus_key: %d %v, want version 1 and nothing else but the instance, its version, the time and the refresh", st, resp)
	}

	mem := hubtest.Start(t, hubtest.Options{})
	st, resp = call(t, "POST", mem.URL+"/v1/ops/bus_key/rotate", mem.AdminToken, nil)
	if st != http.StatusNotFound || errCode(resp) != "not_found" {
		t.Errorf("rotate on the in-memory store: %d %v, want 404 not_found", st, resp)
	}
	heartbeats(t, mem)
	if got := summaryBusKeys(t, mem); len(got) != 1 || got[mem.Server.InstanceID()] != nil {
		t.Errorf("fabric summary's bus key versions on the in-memory store: %v, want its one instance's null (unknown)", got)
	}

	// The store gone: 503 registry_unavailable, and no rotation.
	_ = p.storeA.Close()
	st, resp = call(t, "POST", p.a.URL+"/v1/ops/bus_key/rotate", p.a.AdminToken, nil)
	if st != http.StatusServiceUnavailable || errCode(resp) != "registry_unavailable" {
		t.Errorf("rotate with the store closed: %d %v, want 503 registry_unavailable", st, resp)
	}
	if v, _, err := p.storeB.BusKey(t.Context()); err != nil || v != 1 {
		t.Errorf("bus key version %d, %v after a refused rotation, want 1", v, err)
	}
}
