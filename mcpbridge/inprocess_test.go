package mcpbridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/mcpbridge"
)

// inProcess runs a bridge in this process (so -race and goleak see its
// goroutines) and connects an MCP client to it over t's transport; both
// end with the test.
func inProcess(t *testing.T, h *hubtest.Hub, name string, cfg mcpbridge.Config) *mcpbridge.Bridge {
	t.Helper()
	cfg.HubURLs, cfg.APIKey, cfg.SessionID = []string{h.URL}, h.APIKey, name
	cfg.StateDir = t.TempDir()
	b, err := mcpbridge.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

func callOK(t *testing.T, cs *mcp.ClientSession, tool string, args, out any) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil || res.IsError {
		t.Fatalf("%s: %v %v", tool, err, res)
	}
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatal(err)
	}
}

// The bridge in process, over stdio's in-memory stand-in and over MCP's
// streamable HTTP transport (--http): a signal goes across, is read once,
// and the bridges close leaving no goroutine behind.
func TestBridgeInProcessStdioAndHTTP(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	alice := inProcess(t, h, "alice", mcpbridge.Config{})
	bob := inProcess(t, h, "bob", mcpbridge.Config{HTTPAddr: "127.0.0.1:0"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	serverT, clientT := mcp.NewInMemoryTransports()
	served := make(chan error, 1)
	go func() { served <- alice.Serve(ctx, serverT) }()
	addr := make(chan string, 1)
	httpDone := make(chan error, 1)
	go func() { httpDone <- bob.ServeHTTP(ctx, func(a string) { addr <- a }) }()

	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil)
	aliceCS, err := client.Connect(ctx, clientT, nil)
	if err != nil {
		t.Fatal(err)
	}
	bobCS, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + <-addr + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}

	var sent sendResult
	callOK(t, aliceCS, "send_signal", map[string]any{"to": "bob", "text": "over http"}, &sent)
	var got []signal
	for len(got) == 0 {
		var r readResult
		callOK(t, bobCS, "read_signals", map[string]any{"wait_seconds": 10}, &r)
		got = append(got, r.Signals...)
	}
	callOK(t, bobCS, "send_signal", map[string]any{"to": "alice", "text": "over stdio"}, &sent)
	var back readResult
	callOK(t, aliceCS, "read_signals", map[string]any{"wait_seconds": 10}, &back)
	if tx := texts(t, append(got, back.Signals...)); !slices.Equal(tx, []string{"over http", "over stdio"}) {
		t.Fatalf("read %v", tx)
	}
	var again readResult
	callOK(t, bobCS, "read_signals", nil, &again)
	if len(again.Signals) != 0 {
		t.Fatalf("returned twice: %v", again.Signals)
	}
	eventually(t, "both acknowledged on the hub", func() bool {
		var a, b struct{ Total int }
		opsGet(t, h.URL, h.AdminToken, "/v1/ops/sessions/t1/p1/alice/signals", &a)
		opsGet(t, h.URL, h.AdminToken, "/v1/ops/sessions/t1/p1/bob/signals", &b)
		return a.Total == 0 && b.Total == 0
	})

	_ = aliceCS.Close()
	_ = bobCS.Close()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	cancel()
	if err := <-httpDone; err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
}

// --http on an address other machines may reach serves an MCP endpoint that
// asks for no credential: the bridge warns, naming the fix; on loopback it
// does not.
func TestHTTPOffLoopbackWarns(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	for i, c := range []struct {
		addr string
		warn bool
	}{{"127.0.0.1:0", false}, {"0.0.0.0:0", true}} {
		var logs syncBuffer
		b := inProcess(t, h, fmt.Sprint("http-agent-", i), mcpbridge.Config{HTTPAddr: c.addr, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		ready := make(chan struct{})
		go func() { done <- b.ServeHTTP(ctx, func(string) { close(ready) }) }()
		<-ready
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("%s: ServeHTTP: %v", c.addr, err)
		}
		if warned := strings.Contains(logs.String(), "give --http a loopback address"); warned != c.warn {
			t.Errorf("--http %s: warned %v, want %v:\n%s", c.addr, warned, c.warn, logs.String())
		}
		_ = b.Close(context.Background())
	}
}
