package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
)

// The load generator (the Go clients of fleet and durable, in this
// process) takes CPU from the hubs and Postgres on the same cores; its own
// CPU profile over each measured window (-load-profile FILE) shows what a
// send and a received signal cost it.

// loadProfileUsage is -load-profile's help, fleet's and durable's.
const loadProfileUsage = "a file to write this process's CPU profile to (the load generator: the Go clients), over each run's measured window; with several runs, one file each, the run named before the extension (FILE-r1-after-1-NOTIFY.prof)"

// loadProfilePath is where the load profile of one run goes: file itself
// when the invocation makes one run (tag ""), else file with "-tag"
// before its extension (/tmp/cc.prof, r1-after-1-NOTIFY →
// /tmp/cc-r1-after-1-NOTIFY.prof).
func loadProfilePath(file, tag string) string {
	if tag == "" {
		return file
	}
	ext := filepath.Ext(file)
	return strings.TrimSuffix(file, ext) + "-" + tag + ext
}

// checkLoadProfile checks that -load-profile names a file that can be
// written: its directory exists.
func checkLoadProfile(file string) error {
	if file == "" {
		return nil
	}
	if strings.HasSuffix(file, string(filepath.Separator)) {
		return fmt.Errorf("-load-profile %q: want a file, not a directory", file)
	}
	dir := filepath.Dir(file)
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("-load-profile: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("-load-profile: %s is not a directory", dir)
	}
	return nil
}

// loadProfiler records this process's CPU profile between start and
// stop into one file.
type loadProfiler struct {
	path string
	f    *os.File
	err  error
}

// start creates the file and starts the CPU profile; a failure is kept
// for stop to return.
func (p *loadProfiler) start() {
	f, err := os.Create(p.path)
	if err != nil {
		p.err = fmt.Errorf("-load-profile: %w", err)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		p.err = fmt.Errorf("-load-profile: %w", err)
		return
	}
	p.f = f
}

// stop ends the profile and closes its file; it returns what went wrong
// since start, if anything. It may be called when start was not.
func (p *loadProfiler) stop() error {
	if p.f != nil {
		pprof.StopCPUProfile()
		if err := p.f.Close(); err != nil && p.err == nil {
			p.err = fmt.Errorf("-load-profile: %w", err)
		}
		p.f = nil
	}
	return p.err
}

// withLoadProfile wraps marks (nil: none) so that the load profile of
// path covers the measured window, started after marks.start and stopped
// before marks.end: the samples those take are not the load's. done stops
// the profile if the window did not end, and says whether it was written.
// With path "" it returns marks and a done that does nothing.
func withLoadProfile(marks *stepMarks, path string) (_ *stepMarks, done func() error) {
	if path == "" {
		return marks, func() error { return nil }
	}
	p := &loadProfiler{path: path}
	inner := marks
	if inner == nil {
		inner = &stepMarks{start: func() {}, end: func() {}}
	}
	return &stepMarks{
		start: func() { inner.start(); p.start() },
		end:   func() { _ = p.stop(); inner.end() },
	}, p.stop
}
