package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/marconihub/marconi/internal/haproxytest"
	yaml "go.yaml.in/yaml/v3"
)

// compose is the part of docker-compose.yml these checks read.
type compose struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       any               `yaml:"build"`
		PullPolicy  string            `yaml:"pull_policy"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Healthcheck *struct {
			Test        []string `yaml:"test"`
			StartPeriod string   `yaml:"start_period"`
		} `yaml:"healthcheck"`
	} `yaml:"services"`
}

func readCompose(t *testing.T) compose {
	t.Helper()
	data, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// This machine has no Docker engine: these checks hold docker-compose.yml to
// what the soak test runs. One image built once, a health check with a start
// period on every long-running service, and the balancer's file the same as
// the test's, naming every instance.
func TestComposeMatchesTheTestedTopology(t *testing.T) {
	c := readCompose(t)
	var builders []string
	for name, s := range c.Services {
		if s.Build != nil {
			builders = append(builders, name)
		}
	}
	if len(builders) != 1 {
		t.Fatalf("services with a build: %v, want exactly one (the image is built once)", builders)
	}
	image := c.Services[builders[0]].Image
	if image == "" {
		t.Fatalf("%s builds an image without naming it", builders[0])
	}

	cfg, err := os.ReadFile("haproxy.cfg")
	if err != nil {
		t.Fatal(err)
	}
	lb, ok := c.Services["lb"]
	if !ok || !slices.Contains(lb.Volumes, "./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro") {
		t.Fatalf("no lb service mounting deploy/haproxy.cfg: %+v", lb)
	}
	hubs := 0
	for name, s := range c.Services {
		id := s.Environment["MARCONI_INSTANCE_ID"]
		if s.Image != image || id == "" {
			continue
		}
		hubs++
		if s.Build != nil || s.PullPolicy != "never" {
			t.Errorf("%s: reuses %s, so no build and pull_policy never; got build %v, pull_policy %q", name, image, s.Build, s.PullPolicy)
		}
		if s.Healthcheck == nil || s.Healthcheck.StartPeriod == "" || !strings.Contains(strings.Join(s.Healthcheck.Test, " "), "/readyz") {
			t.Errorf("%s: want a /readyz health check with a start_period, got %+v", name, s.Healthcheck)
		}
		if want := "/i/" + id; !strings.HasSuffix(s.Environment["MARCONI_PUBLIC_URL"], want) {
			t.Errorf("%s: MARCONI_PUBLIC_URL %q, want the balancer's URL + %s", name, s.Environment["MARCONI_PUBLIC_URL"], want)
		}
		server := regexp.MustCompile(`(?m)^\s*server ` + regexp.QuoteMeta(id) + ` "\$\{(MARCONI_HUB_\d)\}" check`).FindSubmatch(cfg)
		if server == nil {
			t.Errorf("haproxy.cfg has no checked server %s", id)
			continue
		}
		if got := lb.Environment[string(server[1])]; got != name+":8080" {
			t.Errorf("lb: %s = %q, want %s:8080", server[1], got, name)
		}
		if !strings.Contains(string(cfg), fmt.Sprintf("use-server %s if { var(txn.instance) -m str %s }", id, id)) {
			t.Errorf("haproxy.cfg does not route /i/%s/ to %s", id, id)
		}
	}
	if hubs != 3 {
		t.Errorf("%d hub instances in docker-compose.yml, want the soak test's 3", hubs)
	}
	if pg := c.Services["postgres"]; pg.Healthcheck == nil || pg.Healthcheck.StartPeriod == "" {
		t.Errorf("postgres: want a health check with a start_period")
	}
	for _, check := range []string{"option httpchk", "http-check send meth GET uri /readyz", "timeout tunnel"} {
		if !strings.Contains(string(cfg), check) {
			t.Errorf("haproxy.cfg lacks %q", check)
		}
	}
}

// HAProxy accepts the file with the addresses compose gives it.
func TestHAProxyConfigIsValid(t *testing.T) {
	haproxy := haproxytest.Require(t)
	cmd := exec.Command(haproxy, "-c", "-f", "haproxy.cfg")
	cmd.Env = append(os.Environ(), "MARCONI_LB_BIND=:8080", "MARCONI_LB_STATS=:8404",
		"MARCONI_HUB_1=hub-1:8080", "MARCONI_HUB_2=hub-2:8080", "MARCONI_HUB_3=hub-3:8080")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
}

// The build context keeps what the build embeds.
func TestDockerignoreKeepsTheBuild(t *testing.T) {
	data, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		for _, needed := range []string{"go.mod", "go.sum", "cmd", "migrations", "web", "web/static"} {
			if line == needed || line == needed+"/" {
				t.Errorf(".dockerignore excludes %s, which the build needs", needed)
			}
		}
	}
	if !strings.Contains(string(data), ".git") {
		t.Error(".dockerignore does not exclude .git")
	}
}

// balancingWords maps how a text may name an HAProxy balancing algorithm
// to the algorithm's name in haproxy.cfg; a hash on a header is named as
// the file names it, hdr(<name>).
var balancingWords = map[string]string{
	"round robin": "roundrobin", "round-robin": "roundrobin", "roundrobin": "roundrobin",
	"static-rr": "static-rr", "leastconn": "leastconn", "least connections": "leastconn",
	"least-connections": "leastconn",
}

// Where the docs and marconi-bench's help and output name deploy/haproxy.cfg
// and a balancing algorithm on one line, it is the one the file's balance
// line sets (or, for a hash on a header, the round robin that requests
// without the header fall back to), never another; and some line names the
// file with its algorithm. (Other lines may name others: the alternatives
// docs/operations.md describes, the dated runs of benchmarks-history.md.)
func TestDocsNameTheBalancersAlgorithm(t *testing.T) {
	cfg, err := os.ReadFile("haproxy.cfg")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*balance\s+(\S+)`).FindAllSubmatch(cfg, -1)
	if len(m) != 1 {
		t.Fatalf("haproxy.cfg has %d balance lines, want 1", len(m))
	}
	algo := string(m[0][1])
	allowed := []string{algo}
	if strings.HasPrefix(algo, "hdr(") {
		allowed = append(allowed, "roundrobin")
	}
	var files []string
	for _, pattern := range []string{"../docs/*.md", "../README.md", "../cmd/marconi-bench/*.go", "*.sh", "../docker-compose.yml"} {
		fs, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fs...)
	}
	if len(files) < 10 {
		t.Fatalf("found %d files to read: the globs are broken", len(files))
	}
	words := regexp.MustCompile(`(?i)round[ -]?robin|static-rr|leastconn|least[ -]connections|hdr\([^)]*\)`)
	mentions := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(text), "\n") {
			if !strings.Contains(line, "haproxy.cfg") {
				continue
			}
			for _, w := range words.FindAllString(line, -1) {
				named := balancingWords[strings.ToLower(w)]
				if named == "" {
					named = w // hdr(<name>)
				}
				if named == algo {
					mentions++
				}
				if !slices.Contains(allowed, named) {
					t.Errorf("%s:%d says %q (%s) of haproxy.cfg, but it balances with %s", f, i+1, w, named, algo)
				}
			}
		}
	}
	if mentions == 0 {
		t.Errorf("no line names haproxy.cfg with its algorithm (%s): the docs should", algo)
	}
}
