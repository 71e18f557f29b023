package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDemoTellsTheStory runs `marconi demo` and checks each step of the
// SPEC-168 story happened as told.
func TestDemoTellsTheStory(t *testing.T) {
	var out bytes.Buffer
	if err := runDemo(context.Background(), &out); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{
		`donna sends lafonda "hello": delivery pushed_to_ws, recipient_route_state attached.`,
		`route_state is now route_without_queue`,
		`donna sends lafonda "are you there?": delivery queued_offline, recipient_route_state route_without_queue, selfheal_outcome attempted, recipient_route_stale true.`,
		`sender_route_stale true`,
		`lafonda received "are you there?"`,
		`self-heal reconnects: 1`,
		`donna sends lafonda "welcome back": delivery pushed_to_ws, recipient_route_state attached.`,
		`lafonda received "welcome back"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo did not say %q\n%s", want, text)
		}
	}
}
