package pgcluster

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment variables read by this package.
const (
	// EnvRequire, set to 1, turns missing PostgreSQL tools into a failure.
	EnvRequire = "MARCONI_TEST_REQUIRE_FAILOVER"
	// EnvBinDir overrides where the PostgreSQL server tools are looked for.
	EnvBinDir = "MARCONI_TEST_PG_BINDIR"
)

// DefaultBinDir is where Debian's postgresql-15 package puts its tools.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// Database is the database each cluster is made with, for the hub.
const Database = "marconi"

// osUser runs the servers; Postgres refuses to run as root.
const osUser = "postgres"

// stepTimeout bounds one step (initdb, a base backup, a start, a promotion).
const stepTimeout = 2 * time.Minute

// Node is one Postgres server of the cluster.
type Node struct {
	// Name is "a" or "b": the data directory's name, for the logs.
	Name string
	// Port is where it listens on 127.0.0.1.
	Port int
	dir  string
}

// URL is a postgres:// URL of Database on this node alone.
func (n *Node) URL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", osUser, n.Port, Database)
}

// Cluster is a primary and its standby. Its methods fail the test on error.
// It is safe for concurrent use; the operations themselves run one at a time.
type Cluster struct {
	t       testing.TB
	bin     string
	root    string
	asRoot  bool // the test runs as root: commands run as osUser
	mu      sync.Mutex
	primary *Node
	standby *Node // nil while the cluster runs on the primary alone
	nodes   [2]*Node
}

// New makes a primary with a synchronous standby (synchronous_standby_names
// on the primary, so a commit returns once the standby has it), both
// running, Database created. Everything is stopped and removed in t.Cleanup.
// Without the tools it skips, or fails when EnvRequire=1; with -short it
// skips.
func New(t testing.TB) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping failover test in -short mode: it builds two Postgres clusters")
	}
	c := &Cluster{t: t, bin: binDir()}
	c.requireTools()
	c.asRoot = os.Geteuid() == 0
	root, err := os.MkdirTemp("", "pgcluster-")
	if err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	c.root = root
	t.Cleanup(c.cleanup)
	if c.asRoot {
		u, err := user.Lookup(osUser)
		if err != nil {
			t.Fatalf("pgcluster: running as root needs the %s user: %v", osUser, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(root, uid, gid); err != nil {
			t.Fatalf("pgcluster: %v", err)
		}
	}
	ports := freePorts(t, 2)
	for i, name := range []string{"a", "b"} {
		c.nodes[i] = &Node{Name: name, Port: ports[i], dir: filepath.Join(root, name)}
	}
	a, b := c.nodes[0], c.nodes[1]
	c.run("initdb", "-D", a.dir, "-U", osUser, "--auth=trust", "--no-sync", "-E", "UTF8")
	c.appendConf(a, fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
wal_level = replica
max_wal_senders = 10
hot_standby = on
fsync = off
wal_keep_size = '256MB'
`, a.Port, root))
	c.start(a)
	c.primary = a
	c.exec(a, "CREATE DATABASE "+Database)
	c.addStandby(b)
	return c
}

// Primary is the node that takes writes now.
func (c *Cluster) Primary() *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.primary
}

// Standby is the node that follows the primary now, nil when there is none.
func (c *Cluster) Standby() *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.standby
}

// URL is the multi-host URL a hub is given: both nodes, and
// target_session_attrs=read-write, so a connection lands on whichever
// takes writes.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		osUser, c.nodes[0].Port, c.nodes[1].Port, Database)
}

// CrashPrimary stops the primary with pg_ctl stop -m immediate: as a crash,
// without a shutdown checkpoint; its clients see their connections drop.
func (c *Cluster) CrashPrimary() *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.primary
	c.run("pg_ctl", "stop", "-D", p.dir, "-m", "immediate", "-w")
	c.primary = nil
	return p
}

// Promote promotes the standby (pg_ctl promote, waiting until it takes
// writes). It runs alone: synchronous_standby_names is cleared, as a
// failover manager does when no standby is left, or every commit would wait.
func (c *Cluster) Promote() *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.standby
	c.run("pg_ctl", "promote", "-D", s.dir, "-w")
	c.primary, c.standby = s, nil
	c.execLocked(s, "ALTER SYSTEM SET synchronous_standby_names = ''", "SELECT pg_reload_conf()")
	return s
}

// StopStandby stops the standby (pg_ctl stop -m fast) after making the
// primary's replication asynchronous, as a standby that lags behind an
// asynchronous primary: from then on the primary's commits are on it
// alone, and a failover to the standby loses them. StartStandby starts it
// again.
func (c *Cluster) StopStandby() *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.standby
	c.execLocked(c.primary, "ALTER SYSTEM SET synchronous_standby_names = ''", "SELECT pg_reload_conf()")
	c.run("pg_ctl", "stop", "-D", s.dir, "-m", "fast", "-w")
	c.standby = nil
	return s
}

// StartStandby starts n, stopped by StopStandby, as the standby again: it
// replays what it had, and streams from the primary if one is up.
func (c *Cluster) StartStandby(n *Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(n)
	c.standby = n
}

// Rebuild makes the stopped node n the primary's synchronous standby again:
// its data directory is replaced by a base backup of the primary (as after
// a failover, when the old primary's last WAL may diverge).
func (c *Cluster) Rebuild(n *Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := os.RemoveAll(n.dir); err != nil {
		c.t.Fatalf("pgcluster: %v", err)
	}
	c.addStandbyLocked(n)
}

// Switchover crashes the primary, promotes the standby and rebuilds the old
// primary as the new one's standby: roles swapped, synchronous again.
func (c *Cluster) Switchover() {
	old := c.CrashPrimary()
	c.Promote()
	c.Rebuild(old)
}

func (c *Cluster) addStandby(n *Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addStandbyLocked(n)
}

// addStandbyLocked base-backs-up the primary into n, starts n as its
// standby and makes the primary wait for it on every commit.
func (c *Cluster) addStandbyLocked(n *Node) {
	p := c.primary
	c.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-U", osUser,
		"-D", n.dir, "-R", "-X", "stream", "--no-sync", "-c", "fast")
	c.appendConf(n, fmt.Sprintf("port = %d\n", n.Port))
	c.start(n)
	c.standby = n
	c.execLocked(p, "ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()")
	c.waitSync(p)
}

// waitSync waits until p has a synchronous standby streaming.
func (c *Cluster) waitSync(p *Node) {
	deadline := time.Now().Add(stepTimeout)
	for {
		var n int
		err := c.query(p, `SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync' AND state = 'streaming'`, &n)
		if err == nil && n > 0 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("pgcluster: no synchronous standby streaming from %s within %v (last error %v)", p.Name, stepTimeout, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the server, with a deadline
	}
}

func (c *Cluster) start(n *Node) {
	c.run("pg_ctl", "start", "-D", n.dir, "-l", filepath.Join(c.root, n.Name+".log"), "-w", "-t", "120")
}

// appendConf appends to n's postgresql.conf (later lines win).
func (c *Cluster) appendConf(n *Node, text string) {
	f, err := os.OpenFile(filepath.Join(n.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		c.t.Fatalf("pgcluster: %v", err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		c.t.Fatalf("pgcluster: %v", err)
	}
}

// exec runs statements, one by one, on n's postgres database.
func (c *Cluster) exec(n *Node, stmts ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.execLocked(n, stmts...)
}

func (c *Cluster) execLocked(n *Node, stmts ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL(n))
	if err != nil {
		c.t.Fatalf("pgcluster: connect to %s: %v", n.Name, err)
	}
	defer conn.Close(ctx)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			c.t.Fatalf("pgcluster: %s on %s: %v", s, n.Name, err)
		}
	}
}

func (c *Cluster) query(n *Node, sql string, dst any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL(n))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dst)
}

func adminURL(n *Node) string {
	return (&url.URL{Scheme: "postgres", User: url.User(osUser), Host: fmt.Sprintf("127.0.0.1:%d", n.Port),
		Path: "postgres", RawQuery: "sslmode=disable"}).String()
}

// run runs one of the server tools, as osUser when the test runs as root.
func (c *Cluster) run(tool string, args ...string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, tool), args...)
	if c.asRoot {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", osUser, "--", filepath.Join(c.bin, tool)}, args...)...)
	}
	cmd.Dir = c.root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("pgcluster: %s %s: %v\n%s%s", tool, strings.Join(args, " "), err, out.String(), c.logs())
	}
}

// logs is the tail of each server's log, for a failure's message.
func (c *Cluster) logs() string {
	var b strings.Builder
	for _, n := range c.nodes {
		if n == nil {
			continue
		}
		text, err := os.ReadFile(filepath.Join(c.root, n.Name+".log"))
		if err != nil {
			continue
		}
		if len(text) > 4000 {
			text = text[len(text)-4000:]
		}
		fmt.Fprintf(&b, "--- %s.log (tail) ---\n%s", n.Name, text)
	}
	return b.String()
}

// cleanup stops every server still running and removes the directory.
func (c *Cluster) cleanup() {
	for _, n := range c.nodes {
		if n == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(n.dir, "postmaster.pid")); err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
		args := []string{filepath.Join(c.bin, "pg_ctl"), "stop", "-D", n.dir, "-m", "immediate", "-w"}
		if c.asRoot {
			args = append([]string{"runuser", "-u", osUser, "--"}, args...)
		}
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			c.t.Errorf("pgcluster: stop %s: %v\n%s", n.Name, err, out)
		}
		cancel()
	}
	if err := os.RemoveAll(c.root); err != nil {
		c.t.Errorf("pgcluster: remove %s: %v", c.root, err)
	}
}

func binDir() string {
	if d := os.Getenv(EnvBinDir); d != "" {
		return d
	}
	return DefaultBinDir
}

// requireTools skips (or fails, EnvRequire=1) when a tool is missing.
func (c *Cluster) requireTools() {
	c.t.Helper()
	var missing []string
	for _, tool := range []string{"initdb", "pg_ctl", "pg_basebackup"} {
		if _, err := os.Stat(filepath.Join(c.bin, tool)); err != nil {
			missing = append(missing, tool)
		}
	}
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("runuser"); err != nil {
			missing = append(missing, "runuser")
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("PostgreSQL server tools %v not found in %s (set %s)", missing, c.bin, EnvBinDir)
	if os.Getenv(EnvRequire) == "1" {
		c.t.Fatalf("%s and %s=1: failover tests must run", msg, EnvRequire)
	}
	c.t.Skipf("skipping failover test: %s", msg)
}

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("pgcluster: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}
