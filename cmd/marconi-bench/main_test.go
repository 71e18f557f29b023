package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

func TestParseOptionsBounds(t *testing.T) {
	env := func(k string) string {
		if k == "MARCONI_BENCH_API_KEY" {
			return "mak_0123456789abcdef"
		}
		return ""
	}
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"-hub", "http://127.0.0.1:8080"}, ""},
		{[]string{"-hub", "http://localhost:8080", "-agents", "2000", "-rate", "2.5"}, ""},
		{[]string{"-hub", "http://[::1]:8080", "-rate", "0", "-agents", "1"}, ""},
		{[]string{"-hub", "http://10.0.0.5:8080"}, "loopback"},
		{[]string{"-hub", "http://example.com"}, "loopback"},
		{[]string{"-hub", "ftp://127.0.0.1"}, "http(s)"},
		{[]string{"-agents", "2001"}, "-agents"},
		{[]string{"-agents", "0"}, "-agents"},
		{[]string{"-duration", "6m"}, "-duration"},
		{[]string{"-agents", "2000", "-rate", "3"}, "at most 5000"},
		{[]string{"-agents", "1", "-rate", "1"}, "at least 2 agents"},
		{[]string{"-projects", "2"}, "MARCONI_BENCH_API_KEY lists 1 keys"},
		{[]string{"-projects", "0"}, "-projects"},
		{[]string{"-projects", "65"}, "-projects"},
	} {
		_, err := parseOptions(tc.args, env, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: error %v, want one mentioning %q", tc.args, err, tc.wantErr)
		}
	}
	if _, err := parseOptions(nil, func(string) string { return "" }, io.Discard); err == nil {
		t.Error("no API key: want an error")
	}
}

func TestParseOptionsProjects(t *testing.T) {
	env := func(keys string) func(string) string {
		return func(k string) string {
			if k == "MARCONI_BENCH_API_KEY" {
				return keys
			}
			return ""
		}
	}
	o, err := parseOptions([]string{"-projects", "3", "-agents", "6"}, env("k1,k2,k3"), io.Discard)
	if err != nil || !slices.Equal(o.apiKeys, []string{"k1", "k2", "k3"}) {
		t.Fatalf("three projects: keys %v, %v", o.apiKeys, err)
	}
	for _, tc := range []struct {
		args    []string
		keys    string
		wantErr string
	}{
		{[]string{"-projects", "2"}, "k1,k2,k3", "lists 3 keys"},
		{[]string{"-projects", "2"}, "k1,", "none empty"},
		{[]string{"-agents", "2"}, "k1,k2", "lists 2 keys"},
		{[]string{"-projects", "3", "-agents", "5"}, "k1,k2,k3", "at least 6 agents"},
	} {
		if _, err := parseOptions(tc.args, env(tc.keys), io.Discard); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%v with keys %q: error %v, want one mentioning %q", tc.args, tc.keys, err, tc.wantErr)
		}
	}
}

// TestPartners: each agent sends to another agent of its own project, and
// each receives from exactly one.
func TestPartners(t *testing.T) {
	for _, tc := range []struct{ n, projects int }{{2, 1}, {3, 1}, {300, 1}, {4, 2}, {7, 3}, {300, 8}, {10, 5}} {
		to := partners(tc.n, tc.projects)
		from := make([]int, tc.n)
		for i, j := range to {
			if j == i || j%tc.projects != i%tc.projects {
				t.Errorf("%d agents over %d projects: agent %d (project %d) sends to %d (project %d)", tc.n, tc.projects, i, i%tc.projects, j, j%tc.projects)
			}
			from[j]++
		}
		for i, k := range from {
			if k != 1 {
				t.Errorf("%d agents over %d projects: agent %d receives from %d agents, want 1", tc.n, tc.projects, i, k)
			}
		}
	}
}

// TestRunAgainstHub runs a tiny load against an in-process hub: every signal
// sent is received, and the report names the hub's figures.
func TestRunAgainstHub(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	h.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	out := runLoad(t, h.APIKey, "-hub", h.URL, "-agents", "3", "-rate", "20", "-duration", "300ms")
	// Each agent's sends are due every 50 ms from its own start, 0, 16.7
	// and 33.3 ms in: six each before the end, however late any is made.
	for _, want := range []string{"offered 18 (60/s)", "go_goroutines", "send -> OnSignal:  n=", "acks per send:     "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestRunOverProjects runs a tiny load over two projects of one hub: each
// agent sends within its project (a send to another project's session
// would fail), and every signal sent is received.
func TestRunOverProjects(t *testing.T) {
	k1, k2 := hub.NewAPIKey(), hub.NewAPIKey()
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{APIKeys: map[string]hub.TenantProject{
		k1: {TenantID: "t1", ProjectID: "p1"}, k2: {TenantID: "t1", ProjectID: "p2"},
	}}})
	h.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	out := runLoad(t, k1+","+k2, "-hub", h.URL, "-agents", "5", "-rate", "20", "-duration", "300ms", "-projects", "2")
	if !strings.Contains(out.String(), "agents spread over 2 projects") {
		t.Errorf("the report does not say the agents are spread over 2 projects:\n%s", out.String())
	}
	// Agents 0, 2, 4 in p1; 1, 3 in p2.
	for p, want := range map[string]int{"p1": 3, "p2": 2} {
		st, r := hubtest.Call(t, "GET", h.URL+"/v1/ops/route_state?tenant_id=t1&project_id="+p, h.AdminToken, nil)
		if got, _ := r["sessions"].([]any); st != 200 || len(got) != want {
			t.Errorf("project %s: %d %d sessions, want %d", p, st, len(got), want)
		}
	}
}

// runLoad runs the plain load with args and MARCONI_BENCH_API_KEY set to
// keys, fails the test unless it exits 0 with every signal sent received
// and none failed, and returns its report.
func runLoad(t *testing.T, keys string, args ...string) *bytes.Buffer {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, func(k string) string {
		if k == "MARCONI_BENCH_API_KEY" {
			return keys
		}
		return ""
	}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errOut.String(), out.String())
	}
	m := regexp.MustCompile(`offered (\d+) .*sent (\d+) .*failed 0, received (\d+)`).FindStringSubmatch(out.String())
	// A send made is never more than one offered; each is answered before
	// the report (none is cut off), so every one is received.
	if m == nil || atoi(t, m[2]) == 0 || atoi(t, m[2]) > atoi(t, m[1]) || atoi(t, m[3]) < atoi(t, m[2]) {
		t.Fatalf("want every sent signal received and none failed; report:\n%s", out.String())
	}
	return &out
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
