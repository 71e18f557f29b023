package mcpbridge_test

import (
	"net"
	"net/http"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/pgtest"
)

// hubProcess is `marconi serve` on Postgres, on a fixed address so that it
// can be stopped and started again where its clients expect it.
type hubProcess struct {
	t      *testing.T
	addr   string
	env    []string
	cmd    *exec.Cmd
	exited chan struct{}
	logs   *syncBuffer
}

const (
	restartAPIKey     = "mak_mcp_restart_test_local_only"
	restartAdminToken = "madm_mcp_restart_test_local_only"
)

func startHubProcess(t *testing.T, dbURL string) *hubProcess {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := &hubProcess{t: t, addr: addr, env: append(cleanEnv(), "MARCONI_ADDR="+addr, "MARCONI_DATABASE_URL="+dbURL,
		"MARCONI_API_KEYS="+restartAPIKey+"=t1/p1", "MARCONI_ADMIN_TOKEN="+restartAdminToken,
		"MARCONI_MODE=development", "MARCONI_LOG_LEVEL=warn", "MARCONI_INSTANCE_ID=mcp-restart")}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *hubProcess) url() string { return "http://" + p.addr }

func (p *hubProcess) start() {
	p.t.Helper()
	p.logs = &syncBuffer{}
	p.cmd = exec.Command(marconiBin, "serve")
	p.cmd.Env = p.env
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(p.cmd, p.exited)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	eventually(p.t, "the hub is ready", func() bool {
		resp, err := client.Get(p.url() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// stop stops the hub as an operator does (SIGTERM: WebSockets closed 1012).
func (p *hubProcess) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(waitFor):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
}

// The hub restarts on Postgres in the middle of a conversation: while it is
// down a send is a tool error and the servers live on; once it is back both
// bridges reconnect by themselves, every signal stored before is delivered,
// and the conversation goes on without a lost or repeated signal.
func TestHubRestartOnPostgres(t *testing.T) {
	hub := startHubProcess(t, pgtest.Schema(t))
	alice := startAgent(t, "alice", hub.url(), restartAPIKey)
	bob := startAgent(t, "bob", hub.url(), restartAPIKey)

	var aliceGot, bobGot []signal
	alice.send("bob", "one", &aliceGot)
	bob.readUntil(1, &bobGot)
	alice.send("bob", "two (unread across the restart)", &aliceGot)
	bob.send("alice", "reply one", &bobGot)

	hub.stop()
	code, msg := alice.toolErr("send_signal", map[string]any{"to": "bob", "text": "into the void"})
	if code != "hub_unreachable" {
		t.Fatalf("send with the hub down: %s %s", code, msg)
	}
	hub.start()

	eventually(t, "both bridges attached again", func() bool {
		a, _ := routeState(t, hub.url(), restartAdminToken, "alice")
		b, _ := routeState(t, hub.url(), restartAdminToken, "bob")
		return a == "attached" && b == "attached"
	})
	if !alice.hasLog("reconnecting") {
		t.Errorf("alice's host was not told of the reconnect")
	}
	alice.send("bob", "three", &aliceGot)
	bob.readUntil(3, &bobGot)
	if tx := texts(t, bobGot); !slices.Equal(tx, []string{"one", "two (unread across the restart)", "three"}) {
		t.Fatalf("bob read %v", tx)
	}
	alice.readUntil(1, &aliceGot)
	if tx := texts(t, aliceGot); !slices.Equal(tx, []string{"reply one"}) {
		t.Fatalf("alice read %v", tx)
	}
}
