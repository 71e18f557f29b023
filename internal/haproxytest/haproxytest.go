// Package haproxytest starts HAProxy with the project's own balancer
// configuration (deploy/haproxy.cfg) in front of three hubs, for the tests
// that prove what a fleet behind it does (the deploy tests, the store
// failover in cmd/marconi).
package haproxytest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/marconihub/marconi/internal/testlog"
	"github.com/marconihub/marconi/internal/testwait"
)

// EnvRequire, set to "1" (CI sets it), makes a test fail instead of skip
// when haproxy is missing.
const EnvRequire = "MARCONI_TEST_REQUIRE_HAPROXY"

// Require returns the haproxy binary, or skips t (fails it when
// MARCONI_TEST_REQUIRE_HAPROXY=1).
func Require(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("haproxy")
	if err == nil {
		return path
	}
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s=1 but haproxy is missing: %v", EnvRequire, err)
	}
	t.Skipf("skipping: haproxy not found (apt-get install haproxy; %s=1 fails instead)", EnvRequire)
	return ""
}

// FreeAddr is a loopback address free at the time of the call.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Start runs haproxy (the binary Require returned) on deploy/haproxy.cfg,
// listening on bind with hubs as hub-1, hub-2 and hub-3 (host:port each),
// and waits until it routes /readyz to a ready hub. The test's cleanup
// kills it and waits for it; a failed test logs its output.
func Start(t testing.TB, haproxy, bind string, hubs [3]string) {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	cfg := filepath.Join(filepath.Dir(self), "..", "..", "deploy", "haproxy.cfg")
	env := []string{"MARCONI_LB_BIND=" + bind, "MARCONI_LB_STATS=" + FreeAddr(t)}
	for i, h := range hubs {
		env = append(env, fmt.Sprintf("MARCONI_HUB_%d=%s", i+1, h))
	}
	out := &testlog.Buffer{}
	cmd := exec.Command(haproxy, "-db", "-f", cfg)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start haproxy: %v", err)
	}
	done := make(chan struct{})
	go func() { // waited for through done by the cleanup
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		if t.Failed() {
			t.Logf("haproxy's output:\n%s", out.String())
		}
	})
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	WaitOK(t, client, "HAProxy to route to a ready hub", "http://"+bind+"/readyz", 20*time.Second)
}

// WaitOK polls a GET of url with client until it answers 200; past within
// it fails t naming what.
func WaitOK(t testing.TB, client *http.Client, what, url string, within time.Duration) {
	t.Helper()
	testwait.ForNil(t, what+" ("+url+")", within, func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}
