package bootstrap_test

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub/hubtest"
)

// fatals records what OnFatal was called with.
type fatals struct {
	mu   sync.Mutex
	errs []error
}

func (f *fatals) on(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, err)
}

func (f *fatals) get() []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]error(nil), f.errs...)
}

// TestOnFatalWhenTheHubNoLongerKnowsTheAPIKey: a development hub on the
// memory store restarts and makes itself a new API key. The client's
// reattach finds its session gone (410), its registration again is refused
// 401, and the client stops for good: OnFatal is called once with the hub's
// *Error (unauthorized), not only logged.
func TestOnFatalWhenTheHubNoLongerKnowsTheAPIKey(t *testing.T) {
	h1 := hubtest.Start(t, hubtest.Options{})
	fwd := newForwarder(t, h1.URL)
	var f fatals
	c := dialConfig(t, bootstrap.Config{HubURL: fwd.URL(), APIKey: h1.APIKey, SessionID: "fatal-a", OnFatal: f.on})

	h1.Close()
	h2 := hubtest.Start(t, hubtest.Options{}) // a new API key: the client's is unknown now
	if h2.APIKey == h1.APIKey {
		t.Fatal("the restarted hub kept the API key; the test needs a new one")
	}
	fwd.retarget(h2.URL)

	waitFor(t, "OnFatal", func() bool { return len(f.get()) > 0 })
	errs := f.get()
	var he *bootstrap.Error
	if len(errs) != 1 || !errors.As(errs[0], &he) || he.Status != 401 || he.Code != "unauthorized" {
		t.Fatalf("OnFatal got %v, want once the hub's 401 unauthorized", errs)
	}
	_ = c.Close()
	if n := len(f.get()); n != 1 {
		t.Errorf("OnFatal called %d times, want once (Close is no fatal stop)", n)
	}
}

// TestOnFatalWhenReplaced: another process resumes the session with the
// token this client keeps; the client's WebSocket is closed 4409 and it
// stops for good, telling the application with ErrReplaced.
func TestOnFatalWhenReplaced(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	store := bootstrap.FileTokenStore(filepath.Join(t.TempDir(), "token.json"))
	var f fatals
	first := dialConfig(t, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "replaced-a", TokenStore: store, OnFatal: f.on})
	second := dialConfig(t, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "replaced-a", TokenStore: store})

	waitFor(t, "the first client's OnFatal", func() bool { return len(f.get()) > 0 })
	if errs := f.get(); len(errs) != 1 || !errors.Is(errs[0], bootstrap.ErrReplaced) {
		t.Fatalf("OnFatal got %v, want once ErrReplaced", errs)
	}
	_ = first.Close()
	if _, err := second.Send(t.Context(), "replaced-a", "", map[string]int{"n": 1}); err != nil {
		t.Fatalf("the newer client sends: %v", err)
	}
}
