package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestBuildInfoRevision: the revision comes from the VCS settings, else from
// the one stamped at link time (the Docker build), else it is "unknown".
func TestBuildInfoRevision(t *testing.T) {
	vcs := func(kv ...string) *debug.BuildInfo {
		info := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}}
		for i := 0; i+1 < len(kv); i += 2 {
			info.Settings = append(info.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return info
	}
	for _, tt := range []struct {
		name    string
		info    *debug.BuildInfo
		ok      bool
		stamped string
		want    string
	}{
		{"vcs", vcs("vcs.revision", "abc123", "vcs.modified", "false"), true, "", "abc123"},
		{"vcs dirty", vcs("vcs.revision", "abc123", "vcs.modified", "true"), true, "", "abc123-dirty"},
		{"vcs wins over the stamp", vcs("vcs.revision", "abc123"), true, "def456", "abc123"},
		{"buildvcs=false, stamped", vcs(), true, "def456", "def456"},
		{"buildvcs=false", vcs(), true, "", "unknown"},
		{"no build info", nil, false, "", "unknown"},
	} {
		if got := buildInfoFrom(tt.info, tt.ok, tt.stamped).Revision; got != tt.want {
			t.Errorf("%s: revision %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestVersionSaysWhyTheRevisionIsUnknown: a test binary carries no VCS
// information, as a build with GOFLAGS=-buildvcs=false: marconi version says
// why the revision is unknown and how to get it; stamped, it prints it.
func TestVersionSaysWhyTheRevisionIsUnknown(t *testing.T) {
	if readBuildInfo().Revision != unknownRevision {
		t.Skip("this test binary carries a revision")
	}
	code, stdout, _ := runCLI(t, nil, "", false, "version")
	if code != 0 || !strings.Contains(stdout, "(revision unknown,") || !strings.Contains(stdout, "-buildvcs=false") ||
		!strings.Contains(stdout, `-ldflags "-X main.revision=$(git rev-parse HEAD)"`) || !strings.Contains(stdout, "--build-arg REVISION=") {
		t.Errorf("version without VCS information: exit %d, %q", code, stdout)
	}
	old := revision
	revision = "def456"
	defer func() { revision = old }()
	code, stdout, _ = runCLI(t, nil, "", false, "version")
	if code != 0 || !strings.Contains(stdout, "(revision def456,") || strings.Contains(stdout, "unknown:") {
		t.Errorf("version stamped with -X main.revision: exit %d, %q", code, stdout)
	}
}
