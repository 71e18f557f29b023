package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// capacityStubs stand in for what deploy/capacity.sh runs, so that its
// plumbing is tested in a second, without a build, Postgres or load: go
// "builds" each binary by copying the stub of its name, and each stub
// records the GOMAXPROCS it was started with.
var capacityStubs = map[string]string{
	"go": `#!/bin/sh
# go env GOVERSION | go build -o OUT ./cmd/NAME (each build noted in builds)
[ "$1" = env ] && { echo go0.stub; exit 0; }
echo "$4" >> "$CAPACITY_STUBS/builds"
cp "$CAPACITY_STUBS/$(basename "$4")" "$3"
`,
	"marconi": `#!/bin/sh
echo "${GOMAXPROCS-unset}" > "$CAPACITY_STUBS/ran-$MARCONI_INSTANCE_ID"
echo "$MARCONI_PUBLIC_URL" > "$CAPACITY_STUBS/public-$MARCONI_INSTANCE_ID"
echo "$MARCONI_API_KEYS" > "$CAPACITY_STUBS/keys-$MARCONI_INSTANCE_ID"
exec sleep 60
`,
	"marconi-bench": `#!/bin/sh
echo "bench GOMAXPROCS=${GOMAXPROCS-unset}"
echo "bench args: $*"
echo "bench keys: $MARCONI_BENCH_API_KEY"
`,
	"haproxy": "#!/bin/sh\nexec sleep 60\n",
	"psql":    "#!/bin/sh\n",
	"curl":    "#!/bin/sh\n",
}

// deploy/capacity.sh gives the hubs the caller's GOMAXPROCS and runs the
// load generator without it (Go's default), so that docs/operations.md's
// advice (GOMAXPROCS per instance) is what a run measures.
func TestCapacityScriptGOMAXPROCSIsTheHubsOnly(t *testing.T) {
	stubs, out, err := runCapacityStubbed(t, "3", "GOMAXPROCS=1")
	if err != nil {
		t.Fatalf("capacity.sh: %v\n%s", err, out)
	}
	for _, id := range []string{"hub-1", "hub-2", "hub-3"} {
		got, err := os.ReadFile(filepath.Join(stubs, "ran-"+id))
		if err != nil {
			t.Fatalf("%s did not start: %v\n%s", id, err, out)
		}
		if strings.TrimSpace(string(got)) != "1" {
			t.Errorf("%s ran with GOMAXPROCS %q, want the caller's 1", id, strings.TrimSpace(string(got)))
		}
	}
	if !strings.Contains(string(out), "bench GOMAXPROCS=unset\n") {
		t.Errorf("the load generator did not run with Go's default GOMAXPROCS:\n%s", out)
	}
	if !strings.Contains(string(out), "hubs: GOMAXPROCS=1; load generator: GOMAXPROCS=default\n") {
		t.Errorf("capacity.sh does not say which GOMAXPROCS each side has:\n%s", out)
	}
}

// deploy/capacity.sh's CAPACITY_PUBLIC_URL makes the three instances
// publish their balancer paths (balancer, the default) or their own
// addresses (direct), and refuses anything else before it starts a thing.
func TestCapacityScriptPublicURL(t *testing.T) {
	for _, tc := range []struct {
		knob string
		want map[string]string
	}{
		{"", map[string]string{"hub-1": "http://127.0.0.1:19080/i/hub-1", "hub-3": "http://127.0.0.1:19080/i/hub-3"}},
		{"balancer", map[string]string{"hub-2": "http://127.0.0.1:19080/i/hub-2"}},
		{"direct", map[string]string{"hub-1": "http://127.0.0.1:19081", "hub-2": "http://127.0.0.1:19082", "hub-3": "http://127.0.0.1:19083"}},
	} {
		stubs, out, err := runCapacityStubbed(t, "3", "CAPACITY_PUBLIC_URL="+tc.knob)
		if err != nil {
			t.Fatalf("CAPACITY_PUBLIC_URL=%q: %v\n%s", tc.knob, err, out)
		}
		for id, want := range tc.want {
			got, err := os.ReadFile(filepath.Join(stubs, "public-"+id))
			if err != nil {
				t.Fatalf("CAPACITY_PUBLIC_URL=%q: %s did not start: %v\n%s", tc.knob, id, err, out)
			}
			if strings.TrimSpace(string(got)) != want {
				t.Errorf("CAPACITY_PUBLIC_URL=%q: %s published %q, want %q", tc.knob, id, strings.TrimSpace(string(got)), want)
			}
		}
	}
	wantCapacityRefused(t, "3", "CAPACITY_PUBLIC_URL", "Direct")
}

// deploy/capacity.sh's CAPACITY_ACK_INTERVAL is the load's agents'
// AckInterval (the client's default when unset), and the load reads the
// run's database; a value that is no duration is refused before anything
// starts.
func TestCapacityScriptAckInterval(t *testing.T) {
	for knob, want := range map[string]string{"": "-ack-interval 0 ", "250ms": "-ack-interval 250ms ", "1s": "-ack-interval 1s "} {
		_, out, err := runCapacityStubbed(t, "1", "CAPACITY_ACK_INTERVAL="+knob)
		if err != nil {
			t.Fatalf("CAPACITY_ACK_INTERVAL=%q: %v\n%s", knob, err, out)
		}
		if !strings.Contains(string(out), want) || !strings.Contains(string(out), "-database-url postgres://postgres@127.0.0.1:5432/marconi_capacity_") {
			t.Errorf("CAPACITY_ACK_INTERVAL=%q: the load was not given %q and the run's database:\n%s", knob, want, out)
		}
	}
	for _, bad := range []string{"250", "fast", "1h"} {
		wantCapacityRefused(t, "1", "CAPACITY_ACK_INTERVAL", bad)
	}
}

// deploy/capacity.sh's CAPACITY_PROJECTS spreads the agents over N projects
// of tenant t1: every hub takes one API key per project, and the load gets
// the N keys and -projects N (nothing new with one, the default, so that a
// marconi-bench of before -projects still runs). A value that is not
// 1..64 is refused before anything starts.
func TestCapacityScriptProjects(t *testing.T) {
	const key = "mak_bench_local_only"
	for _, tc := range []struct {
		knob, instances    string
		hubKeys, benchKeys string
		benchArg           string // in the load's arguments
		noBenchArg         string // not in them
	}{
		{"", "1", key + "=t1/p1", key, "-ack-interval 0 -database-url ", "-projects"},
		{"1", "3", key + "=t1/p1", key, "-ack-interval 0 -database-url ", "-projects"},
		{"3", "3", key + "=t1/p1," + key + "_p2=t1/p2," + key + "_p3=t1/p3", key + "," + key + "_p2," + key + "_p3", "-projects 3 ", ""},
	} {
		stubs, out, err := runCapacityStubbed(t, tc.instances, "CAPACITY_PROJECTS="+tc.knob)
		if err != nil {
			t.Fatalf("CAPACITY_PROJECTS=%q: %v\n%s", tc.knob, err, out)
		}
		n, _ := strconv.Atoi(tc.instances)
		for i := 1; i <= n; i++ {
			got, err := os.ReadFile(filepath.Join(stubs, fmt.Sprintf("keys-hub-%d", i)))
			if err != nil {
				t.Fatalf("CAPACITY_PROJECTS=%q: hub-%d did not start: %v\n%s", tc.knob, i, err, out)
			}
			if strings.TrimSpace(string(got)) != tc.hubKeys {
				t.Errorf("CAPACITY_PROJECTS=%q: hub-%d has MARCONI_API_KEYS %q, want %q", tc.knob, i, strings.TrimSpace(string(got)), tc.hubKeys)
			}
		}
		if !strings.Contains(string(out), "bench keys: "+tc.benchKeys+"\n") || !strings.Contains(string(out), tc.benchArg) ||
			(tc.noBenchArg != "" && strings.Contains(string(out), tc.noBenchArg)) {
			t.Errorf("CAPACITY_PROJECTS=%q: want the load given keys %q and %q (and not %q):\n%s", tc.knob, tc.benchKeys, tc.benchArg, tc.noBenchArg, out)
		}
	}
	for _, bad := range []string{"0", "65", "two", "-1", "03"} {
		wantCapacityRefused(t, "1", "CAPACITY_PROJECTS", bad)
	}
}

// runCapacityStubbed runs deploy/capacity.sh for instances (1 or 3) with
// capacityStubs first on PATH and env added, and returns the stubs'
// directory (what they recorded) and the script's output.
func runCapacityStubbed(t *testing.T, instances string, env ...string) (string, []byte, error) {
	t.Helper()
	stubs := writeStubs(t, capacityStubs)
	// A cache of the test's own: a clean checkout would otherwise keep the
	// stubs in the user's cache as the binaries of its commit.
	cmd := capacityCmd(t, "capacity.sh", instances, stubs, append([]string{"CAPACITY_STUBS=" + stubs,
		"CAPACITY_CACHE_DIR=" + filepath.Join(stubs, "cache")}, env...)...)
	out, err := cmd.CombinedOutput()
	return stubs, out, err
}

// tripwire stands in for every program deploy/capacity.sh runs once it has
// read its settings: it notes that it ran, and fails.
const tripwire = `#!/bin/sh
echo "$(basename "$0")" >> "$CAPACITY_TRIPWIRES/ran"
echo "tripwire: capacity.sh ran $(basename "$0") instead of refusing its settings" >&2
exit 97
`

// wantCapacityRefused runs deploy/capacity.sh for instances with variable
// set to value, and wants it refused, with a message that names the
// variable, before the script runs anything: every program it would run
// (go, git, psql, curl, haproxy, and CAPACITY_BIN_DIR's marconi and
// marconi-bench) is a tripwire, so a script that stopped refusing the value
// fails here at once, without a build, a database or a hub.
func wantCapacityRefused(t *testing.T, instances, variable, value string) {
	t.Helper()
	trips := writeStubs(t, map[string]string{"go": tripwire, "git": tripwire, "psql": tripwire, "curl": tripwire,
		"haproxy": tripwire, "marconi": tripwire, "marconi-bench": tripwire})
	// variable after CAPACITY_BIN_DIR, so that it may be that one; TMPDIR
	// the test's, for the directory a script that does not refuse makes.
	out, err := capacityCmd(t, "capacity.sh", instances, trips, "CAPACITY_TRIPWIRES="+trips, "TMPDIR="+trips,
		"CAPACITY_BIN_DIR="+trips, variable+"="+value).CombinedOutput()
	if ran, _ := os.ReadFile(filepath.Join(trips, "ran")); len(ran) > 0 {
		t.Errorf("%s=%s: capacity.sh ran %s instead of refusing the value:\n%s", variable, value, strings.Fields(string(ran)), out)
		return
	}
	if err == nil || !strings.Contains(string(out), variable) {
		t.Errorf("%s=%s: err %v, want a refusal that names the variable:\n%s", variable, value, err, out)
	}
}

// writeStubs writes an executable file of each text, by name, in a
// directory of the test's own, and returns the directory.
func writeStubs(t *testing.T, stubs map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range stubs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// capacityCmd is the script at path (deploy/capacity.sh or a copy) for
// instances (1 or 3), two agents, one send a second and 1 s, with dir first
// on PATH and env added. It opens deploy/capacity.sh first: go test keeps a
// passing result until a file the test opened in the module changes, and
// bash's reads of the script are not the test's.
func capacityCmd(t *testing.T, path, instances, dir string, env ...string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("deploy/capacity.sh is a bash script, and no bash is on PATH: %v", err)
	}
	f, err := os.Open("capacity.sh")
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	cmd := exec.CommandContext(t.Context(), "bash", path, instances, "2", "1", "1s")
	cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// deploy/capacity.sh builds its binaries once per commit from a clean
// checkout and reuses them; with uncommitted changes it builds them for each
// run; CAPACITY_BIN_DIR names prebuilt ones, which it runs without a build,
// and one without them is refused. Run in a git repository of the test's own
// holding the script, so that its state is the test's.
func TestCapacityScriptReusesBinaries(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("no git on PATH: %v", err)
	}
	script, err := os.ReadFile("capacity.sh")
	if err != nil {
		t.Fatal(err)
	}
	repo, stubs, cache := t.TempDir(), writeStubs(t, capacityStubs), t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, "deploy"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "deploy", "capacity.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	git("add", ".")
	git("commit", "-qm", "capacity")
	builds := func() int {
		b, _ := os.ReadFile(filepath.Join(stubs, "builds"))
		return strings.Count(string(b), "\n")
	}
	run := func(env ...string) string {
		t.Helper()
		cmd := capacityCmd(t, filepath.Join(repo, "deploy", "capacity.sh"), "1", stubs,
			append([]string{"CAPACITY_STUBS=" + stubs, "CAPACITY_CACHE_DIR=" + cache}, env...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("capacity.sh %v: %v\n%s", env, err, out)
		}
		return string(out)
	}

	run()
	if n := builds(); n != 2 {
		t.Fatalf("a clean checkout's first run built %d binaries, want 2", n)
	}
	if out := run(); builds() != 2 || !strings.Contains(out, "built before") {
		t.Fatalf("the second run of the same clean commit built again (%d builds in all, want 2):\n%s", builds(), out)
	}
	if err := os.WriteFile(filepath.Join(repo, "change.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run()
	run()
	if n := builds(); n != 6 {
		t.Fatalf("two runs with an uncommitted change made %d builds in all, want 6 (two each)", n)
	}
	if entries, _ := os.ReadDir(cache); len(entries) != 1 {
		t.Errorf("the cache holds %d entries, want 1: a dirty tree's binaries are not kept", len(entries))
	}

	prebuilt := t.TempDir()
	for _, b := range []string{"marconi", "marconi-bench"} {
		text := capacityStubs[b]
		if b == "marconi" {
			text = "#!/bin/sh\ntouch \"$CAPACITY_STUBS/prebuilt-ran\"\nexec sleep 60\n"
		}
		if err := os.WriteFile(filepath.Join(prebuilt, b), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run("CAPACITY_BIN_DIR=" + prebuilt)
	if n := builds(); n != 6 {
		t.Errorf("CAPACITY_BIN_DIR: %d builds, want none more than 6", n)
	}
	if _, err := os.Stat(filepath.Join(stubs, "prebuilt-ran")); err != nil {
		t.Errorf("CAPACITY_BIN_DIR's marconi did not run: %v", err)
	}
	wantCapacityRefused(t, "1", "CAPACITY_BIN_DIR", filepath.Join(prebuilt, "missing"))
}
