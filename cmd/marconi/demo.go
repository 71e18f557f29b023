package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// demo is `marconi demo`: an in-memory hub and two agents in one process,
// telling SPEC-168's story step by step.
func demo(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return usagef("usage: marconi demo (takes no arguments)")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return runDemo(ctx, stdout)
}

func runDemo(ctx context.Context, w io.Writer) error {
	say := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }

	// The hub listens twice: donna reaches it on one address, lafonda on
	// another whose WebSockets the demo can leave half-open.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	lnB, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ln.Close()
		return err
	}
	hl := newHalfOpenListener(lnB)
	apiKey, admin := hub.NewAPIKey(), hub.NewAdminToken()
	reg := prometheus.NewRegistry()
	store := memstore.New()
	defer store.Close()
	h, err := hub.New(hub.Config{
		Mode:           marconi.Development,
		InstanceID:     "demo",
		APIKeys:        map[string]hub.TenantProject{apiKey: {TenantID: "dev", ProjectID: "dev"}},
		AdminToken:     admin,
		WSPingInterval: 500 * time.Millisecond,
	}, hub.Deps{Store: store, Registry: reg, Gatherer: reg})
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h.Handler(), ReadHeaderTimeout: 5 * time.Second}
	var served sync.WaitGroup
	for _, l := range []net.Listener{ln, hl} {
		served.Add(1)
		go func() {
			defer served.Done()
			_ = srv.Serve(l)
		}()
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = h.Shutdown(sctx)
		_ = srv.Shutdown(sctx)
		hl.closeAll()
		served.Wait()
	}()
	hubURL := "http://" + ln.Addr().String()
	hubURLB := "http://" + lnB.Addr().String()

	say("Marconi demo: SPEC-168 self-heal on send, with two agents and one hub.")
	say("")
	say("1. A hub runs on %s (in memory, self-heal on, pings every 500ms).", hubURL)

	received := map[string]chan bootstrap.Signal{"donna": make(chan bootstrap.Signal, 16), "lafonda": make(chan bootstrap.Signal, 16)}
	dial := func(id, url string) (*bootstrap.Client, error) {
		return bootstrap.Dial(ctx, bootstrap.Config{
			HubURL: url, APIKey: apiKey, SessionID: id, Surface: string(marconi.SurfaceClaudeCode),
			OnSignal: func(s bootstrap.Signal) { received[id] <- s },
			Logger:   slog.New(slog.DiscardHandler),
		})
	}
	donna, err := dial("donna", hubURL)
	if err != nil {
		return err
	}
	defer donna.Close()
	lafonda, err := dial("lafonda", hubURLB)
	if err != nil {
		return err
	}
	defer lafonda.Close()
	say("2. Two agents, donna and lafonda (surface claude_code), register and attach their WebSockets.")

	send := func(from *bootstrap.Client, to, text string) (bootstrap.SendResult, error) {
		return from.Send(ctx, to, "chat", map[string]string{"text": text})
	}
	expect := func(id, text string) error {
		select {
		case s := <-received[id]:
			var p struct{ Text string }
			_ = json.Unmarshal(s.Payload, &p)
			say("   %s received %q (seq %d).", id, p.Text, s.Seq)
			if p.Text != text {
				return fmt.Errorf("%s received %q, expected %q", id, p.Text, text)
			}
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%s never received %q", id, text)
		}
	}
	describe := func(r bootstrap.SendResult) string {
		s := fmt.Sprintf("delivery %s, recipient_route_state %s", r.Delivery, r.RecipientRouteState)
		if r.SelfhealOutcome != "" {
			s += ", selfheal_outcome " + string(r.SelfhealOutcome)
		}
		if r.RecipientRouteStale {
			s += ", recipient_route_stale true"
		}
		if r.SenderRouteStale {
			s += ", sender_route_stale true"
		}
		return s
	}

	r, err := send(donna, "lafonda", "hello")
	if err != nil {
		return err
	}
	say("3. donna sends lafonda \"hello\": %s.", describe(r))
	if err := expect("lafonda", "hello"); err != nil {
		return err
	}

	say("4. lafonda's route silently breaks: her TCP connection goes half-open. Her client still")
	say("   believes it is attached; the hub's pings go unanswered.")
	hl.freezeWebSockets()
	if err := waitRoute(ctx, hubURL, admin, "lafonda", marconi.StateRouteWithoutQueue); err != nil {
		return err
	}
	say("   The hub drops the silent peer and detaches her queue: route_state is now route_without_queue")
	say("   (she proved she was alive moments ago, but no queue holds her WebSocket).")

	r, err = send(donna, "lafonda", "are you there?")
	if err != nil {
		return err
	}
	say("5. donna sends lafonda \"are you there?\": %s.", describe(r))
	say("   The signal is stored. donna's client only logs recipient_route_stale: it is not her connection that is broken.")

	r, err = send(lafonda, "donna", "still here")
	if err != nil {
		return err
	}
	say("6. lafonda sends donna \"still here\": %s.", describe(r))
	say("   Her own send tells her client that her route is stale: it closes its WebSocket and runs the")
	say("   bootstrap connect again.")
	if err := expect("donna", "still here"); err != nil {
		return err
	}
	if err := expect("lafonda", "are you there?"); err != nil {
		return err
	}
	if err := waitRoute(ctx, hubURL, admin, "lafonda", marconi.StateAttached); err != nil {
		return err
	}
	say("   lafonda is attached again (self-heal reconnects: %d) and the signal that waited reached her.", lafonda.Stats().SelfHealReconnects)

	r, err = send(donna, "lafonda", "welcome back")
	if err != nil {
		return err
	}
	say("7. donna sends lafonda \"welcome back\": %s.", describe(r))
	if err := expect("lafonda", "welcome back"); err != nil {
		return err
	}
	say("")
	say("Delivery resumed; nothing was lost. The hub only observed and hinted; the client owned the reconnect.")
	return nil
}

// waitRoute polls the operator API until session reaches state.
func waitRoute(ctx context.Context, hubURL, admin, session string, state marconi.RouteState) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, hubURL+"/v1/ops/route_state/dev/dev/"+session, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var rs struct {
				RouteState marconi.RouteState `json:"route_state"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&rs)
			resp.Body.Close()
			if rs.RouteState == state {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never reached %s", session, state)
		case <-t.C:
		}
	}
}
