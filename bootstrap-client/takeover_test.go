package bootstrap_test

import (
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// TestTakeoverBringsALostAgentBack: an agent stops without deregistering and
// without having kept its token (killed). Started again under its name with
// Takeover it is back in one Dial: the hub answers taken_over, the pending
// signals sent meanwhile are delivered, the application is told its
// runtime-local state is gone (OnAffinityReset, before any signal), and the
// new token is kept. Without Takeover the same start is refused 403.
func TestTakeoverBringsALostAgentBack(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	sender := dial(t, h.URL, h.APIKey, "takeover-sender", nil)
	lost := dialConfig(t, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "donna"})
	_ = lost.Close() // the process dies; its token with it
	sendN(t, sender, "donna", 1, 2)

	refused, err := bootstrap.Dial(t.Context(), bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "donna", Surface: "claude_code"})
	if err == nil {
		_ = refused.Close()
	}
	wantHubError(t, err, 403, "forbidden")
	// The hub's message names a header and a JSON field; the Go application
	// is told which of its own settings brings the session back.
	if !strings.Contains(err.Error(), "Config.TokenStore") || !strings.Contains(err.Error(), "Config.Takeover") {
		t.Errorf("the refusal %q does not name Config.TokenStore and Config.Takeover", err)
	}
	stale := bootstrap.FileTokenStore(filepath.Join(t.TempDir(), "stale.json"))
	if err := stale.Save(t.Context(), bootstrap.SessionToken{SessionID: "donna", Token: "mst_no-longer-current"}); err != nil {
		t.Fatal(err)
	}
	_, err = bootstrap.Dial(t.Context(), bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "donna", Surface: "claude_code", TokenStore: stale})
	wantHubError(t, err, 403, "forbidden")
	if !strings.Contains(err.Error(), "no longer current") || !strings.Contains(err.Error(), "Config.Takeover") {
		t.Errorf("the refusal of a stale kept token %q does not say so", err)
	}

	store := bootstrap.FileTokenStore(filepath.Join(t.TempDir(), "token.json"))
	var in inbox
	var resets atomic.Int64
	in.gate = func(bootstrap.Signal) {
		if resets.Load() != 1 {
			t.Errorf("a signal before OnAffinityReset (%d resets)", resets.Load())
		}
	}
	back := dialConfig(t, bootstrap.Config{
		HubURL: h.URL, APIKey: h.APIKey, SessionID: "donna", Takeover: true, TokenStore: store,
		OnSignal: in.on, OnAffinityReset: func() { resets.Add(1) },
	})
	waitFor(t, "donna to get what was sent while it was gone", func() bool { return in.len() == 2 })
	wantPayloads(t, "taken over", &in, 2)
	if st := back.Stats(); st.Takeovers != 1 || st.Reregistrations != 0 {
		t.Errorf("stats %+v, want one takeover and no re-registration", st)
	}
	kept, err := store.Load(t.Context())
	if err != nil || kept.SessionID != "donna" || kept.Token == "" {
		t.Errorf("kept after the takeover: %+v, %v", kept, err)
	}
}

// TestTakeoverReplacesALiveHolder: a second process takes over a session
// whose first holder still runs. The first is told (OnFatal with
// ErrReplaced, close 4409) and its token stops working; the second sends.
func TestTakeoverReplacesALiveHolder(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	var f fatals
	first := dialConfig(t, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "lafonda", OnFatal: f.on})
	second := dialConfig(t, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "lafonda", Takeover: true})

	waitFor(t, "the first holder's OnFatal", func() bool { return len(f.get()) > 0 })
	if errs := f.get(); len(errs) != 1 || !errors.Is(errs[0], bootstrap.ErrReplaced) {
		t.Fatalf("OnFatal got %v, want once ErrReplaced", errs)
	}
	var he *bootstrap.Error
	if _, err := first.Send(t.Context(), "lafonda", "", 1); !errors.As(err, &he) || he.Status/100 != 4 {
		t.Errorf("the former holder's send: %v; want the hub's refusal, its token stopped working", err)
	}
	if _, err := second.Send(t.Context(), "lafonda", "", 2); err != nil {
		t.Errorf("the new holder's send: %v", err)
	}
}

// TestTakeoverRefusedWhenTheHubForbidsIt: with MARCONI_ALLOW_TAKEOVER=false
// the takeover is refused as any registration of a live id: Dial returns the
// hub's 403 and the live holder keeps its session.
func TestTakeoverRefusedWhenTheHubForbidsIt(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{NoTakeover: true}})
	var f fatals
	holder := dialConfig(t, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "kept-by-policy", OnFatal: f.on})
	_, err := bootstrap.Dial(t.Context(), bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "kept-by-policy", Surface: "claude_code", Takeover: true})
	wantHubError(t, err, 403, "forbidden")
	if _, err := holder.Send(t.Context(), "kept-by-policy", "", 1); err != nil || len(f.get()) != 0 {
		t.Errorf("the holder after a refused takeover: send %v, OnFatal %v; want it untouched", err, f.get())
	}
}
