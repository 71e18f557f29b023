package fabric

import (
	"errors"
	"fmt"
)

// Mode is a session's runtime mode (the runtime_mode field).
type Mode string

// Runtime modes that are implemented.
const (
	ModeStateless Mode = "stateless"
	ModeSticky    Mode = "sticky"
)

// ModeSource is what chose a session's runtime mode (the runtime_mode_source
// field).
type ModeSource string

// Sources of a session's runtime mode.
const (
	SourceExplicit ModeSource = "explicit"
	SourceAdaptive ModeSource = "adaptive-classifier"
	SourceDefault  ModeSource = "default"
)

// ErrReservedMode is returned by NormalizeRuntimeMode for soft_sticky, pinned
// and hybrid: named by the recovery matrix but not implemented.
var ErrReservedMode = errors.New("reserved runtime mode")

// ErrInvalidMode is returned by NormalizeRuntimeMode for any other unknown mode.
var ErrInvalidMode = errors.New("invalid runtime mode")

// NormalizeRuntimeMode accepts only the implemented modes. The guard stays
// until a reserved mode has a complete, tested contract.
func NormalizeRuntimeMode(mode string) (Mode, error) {
	switch m := Mode(mode); m {
	case ModeStateless, ModeSticky:
		return m, nil
	case "soft_sticky", "pinned", "hybrid":
		return "", fmt.Errorf("%w: %q is reserved and not implemented", ErrReservedMode, mode)
	default:
		return "", fmt.Errorf("%w: %q (want stateless or sticky)", ErrInvalidMode, mode)
	}
}
