package testproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/marconihub/marconi/internal/testproxy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echoServer answers every line with the same line, until t ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

type client struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial proxy: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{t: t, conn: c, r: bufio.NewReader(c)}
}

// roundTrip writes a line and reads the echo, with a deadline.
func (c *client) roundTrip(line string, within time.Duration) (string, error) {
	_ = c.conn.SetDeadline(time.Now().Add(within))
	if _, err := io.WriteString(c.conn, line+"\n"); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func (c *client) mustEcho(line string) {
	c.t.Helper()
	got, err := c.roundTrip(line, 5*time.Second)
	if err != nil || got != line {
		c.t.Fatalf("echo of %q = %q, %v", line, got, err)
	}
}

func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}

func TestForwards(t *testing.T) {
	p := testproxy.Start(t, echoServer(t))
	a, b := dial(t, p.Addr()), dial(t, p.Addr())
	a.mustEcho("hello")
	b.mustEcho("world")
	a.mustEcho("again")
}

func TestCutRefusesUntilRestore(t *testing.T) {
	p := testproxy.Start(t, echoServer(t))
	live := dial(t, p.Addr())
	live.mustEcho("before")

	p.Cut()
	if _, err := live.roundTrip("after cut", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("a live connection after Cut: err = %v, want it closed", err)
	}
	if _, err := dial(t, p.Addr()).roundTrip("new while cut", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("a new connection while cut: err = %v, want it closed", err)
	}

	p.Restore()
	dial(t, p.Addr()).mustEcho("after restore")
}

func TestFreezeIsHalfOpen(t *testing.T) {
	p := testproxy.Start(t, echoServer(t))
	frozen := dial(t, p.Addr())
	frozen.mustEcho("before")

	p.Freeze()
	// Nothing comes back, and the connection is not closed either: the
	// read runs into its own deadline.
	if got, err := frozen.roundTrip("into the void", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a frozen connection answered %q, %v; want a read timeout", got, err)
	}
	// New connections still pass.
	dial(t, p.Addr()).mustEcho("fresh")

	// Cut ends the frozen one.
	p.Cut()
	_ = frozen.conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := frozen.r.ReadString('\n'); err == nil || isTimeout(err) {
		t.Fatalf("frozen connection after Cut: err = %v, want it closed", err)
	}
}

func TestPartitionDropsUntilHeal(t *testing.T) {
	p := testproxy.Start(t, echoServer(t))
	live := dial(t, p.Addr())
	live.mustEcho("before")

	p.Partition()
	// Neither the live connection nor a new one is answered or closed.
	if got, err := live.roundTrip("into the void", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a live connection in a partition answered %q, %v; want a read timeout", got, err)
	}
	fresh := dial(t, p.Addr())
	if got, err := fresh.roundTrip("new in a partition", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a new connection in a partition answered %q, %v; want a read timeout", got, err)
	}

	p.Heal()
	for _, c := range []*client{live, fresh} {
		_ = c.conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.r.ReadString('\n'); err == nil || isTimeout(err) {
			t.Fatalf("a connection of the partition after Heal: err = %v, want it closed", err)
		}
	}
	dial(t, p.Addr()).mustEcho("after heal")
}

func TestCloseEndsEverything(t *testing.T) {
	p := testproxy.Start(t, echoServer(t))
	c := dial(t, p.Addr())
	c.mustEcho("x")
	frozen := dial(t, p.Addr())
	frozen.mustEcho("y")
	p.Freeze()
	p.Close()
	p.Close() // idempotent
	for _, cl := range []*client{c, frozen} {
		_ = cl.conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := cl.r.ReadString('\n'); err == nil || isTimeout(err) {
			t.Fatalf("connection after Close: err = %v, want it closed", err)
		}
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Fatal("dialing a closed proxy succeeded")
	}
}

func TestTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	p := testproxy.Start(t, target)
	if _, err := dial(t, p.Addr()).roundTrip("x", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("through a proxy whose target is down: err = %v, want closed", err)
	}
}
