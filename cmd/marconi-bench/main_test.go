package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/collectors"

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

// TestRunAgainstHub runs a tiny load against an in-process hub: every signal
// sent is received, and the report names the hub's figures.
func TestRunAgainstHub(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	h.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"-hub", h.URL, "-agents", "3", "-rate", "20", "-duration", "300ms"},
		func(k string) string {
			if k == "MARCONI_BENCH_API_KEY" {
				return h.APIKey
			}
			return ""
		}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errOut.String(), out.String())
	}
	m := regexp.MustCompile(`sent (\d+) .*failed 0, received (\d+)`).FindStringSubmatch(out.String())
	// A send cut off by the end of the run may still be stored and
	// delivered, so received may exceed sent, never fall short of it.
	if m == nil || atoi(t, m[1]) == 0 || atoi(t, m[2]) < atoi(t, m[1]) {
		t.Fatalf("want every sent signal received and none failed; report:\n%s", out.String())
	}
	for _, want := range []string{"go_goroutines", "send -> OnSignal:  n=", "acks per send:     "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
