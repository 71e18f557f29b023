package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	"github.com/coder/websocket"
)

// floor is `marconi-bench floor -addr A`: the floor of the comparison, a
// bare coder/websocket server that does no work at all. GET /ws?id=K
// attaches connection K (its handler's goroutine reads until it ends);
// POST /send?id=K writes the body to connection K as one text frame.
func floor(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("marconi-bench floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "loopback address to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil || !loopback(host) {
		return fmt.Errorf("-addr %q: want a loopback address", *addr)
	}
	var (
		mu    sync.Mutex
		conns = map[string]*websocket.Conn{}
	)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ws", func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		id := r.URL.Query().Get("id")
		mu.Lock()
		conns[id] = ws
		mu.Unlock()
		for {
			if _, _, err := ws.Read(context.Background()); err != nil {
				break
			}
		}
		mu.Lock()
		delete(conns, id)
		mu.Unlock()
	})
	mux.HandleFunc("POST /send", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		ws := conns[r.URL.Query().Get("id")]
		mu.Unlock()
		if ws == nil {
			http.Error(w, "no such connection", http.StatusNotFound)
			return
		}
		if err := ws.Write(r.Context(), websocket.MessageText, body); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Addr: *addr, Handler: mux}
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
