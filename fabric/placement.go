package fabric

import (
	"slices"
	"strings"

	"github.com/marconihub/marconi"
)

// Hints are what a registration says about its workload; the adaptive
// classifier reads them.
type Hints struct {
	Surface     marconi.Surface
	LocalState  bool
	SideEffects bool
}

// Classify is the adaptive classifier: the mode it recommends for a new
// session. Work that keeps runtime-local state or has side effects needs
// sticky (the recovery matrix: side-effecting or local-stateful requests
// should use sticky); so does a live-WebSocket surface whose agent holds a
// terminal (claude_code, headless_cc, headless_cx) when it declares local
// state. Everything else is replay-safe and goes stateless.
func Classify(h Hints) Mode {
	if h.LocalState || h.SideEffects {
		return ModeSticky
	}
	return ModeStateless
}

// StickyPlacement is how a new sticky session's instance is chosen
// (MARCONI_STICKY_PLACEMENT).
type StickyPlacement string

const (
	// StickyByLoad places it on the healthy instance with the fewest live
	// sticky sessions.
	StickyByLoad StickyPlacement = "fewest"
	// StickyByProject places it where most of its project's live sessions
	// are, by the fewest when none is on a healthy instance.
	StickyByProject StickyPlacement = "project"
)

// PlacementConfig configures runtime-mode resolution and sticky placement.
type PlacementConfig struct {
	// Sticky is MARCONI_STICKY_PLACEMENT: how a new sticky session's
	// instance is chosen. Default StickyByLoad.
	Sticky StickyPlacement
	// DefaultMode is MARCONI_DEFAULT_RUNTIME_MODE (stateless).
	DefaultMode Mode
	// Adaptive is MARCONI_ADAPTIVE_PLACEMENT=on.
	Adaptive bool
	// AdaptiveClients is MARCONI_ADAPTIVE_CLIENTS: client ids the classifier
	// may place; "*" allows every client.
	AdaptiveClients []string
	// RollbackAfter is MARCONI_ADAPTIVE_ROLLBACK_AFTER: once the cluster-wide
	// count of adaptive placement mismatches reaches it, the gate rolls back
	// and the classifier places nothing more. 0 turns it off.
	RollbackAfter int64
}

// ParseClientList splits a comma list of client ids, dropping blanks.
func ParseClientList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// AdaptiveGate decides whether the classifier may place a session.
// The zero value is closed.
type AdaptiveGate interface {
	// Open reports whether the classifier may place a new session of clientID.
	Open(clientID string) bool
}

// ResolveMode picks a new session's runtime mode and its source: an explicit
// mode always wins; else the classifier when the gate is open for clientID;
// else the default.
func ResolveMode(explicit Mode, clientID string, h Hints, gate AdaptiveGate, defaultMode Mode) (Mode, ModeSource) {
	if explicit != "" {
		return explicit, SourceExplicit
	}
	if gate != nil && clientID != "" && gate.Open(clientID) {
		return Classify(h), SourceAdaptive
	}
	return defaultMode, SourceDefault
}

// allowlisted reports whether clientID is on list ("*" allows all).
func allowlisted(list []string, clientID string) bool {
	return slices.Contains(list, "*") || slices.Contains(list, clientID)
}
