package fabric

import (
	"errors"
	"fmt"
)

// Runtime modes that are implemented.
const (
	ModeStateless = "stateless"
	ModeSticky    = "sticky"
)

// Sources of a session's runtime mode.
const (
	SourceExplicit = "explicit"
	SourceAdaptive = "adaptive-classifier"
	SourceDefault  = "default"
)

// ErrReservedMode is returned by NormalizeRuntimeMode for soft_sticky, pinned
// and hybrid: named by the recovery matrix but not implemented.
var ErrReservedMode = errors.New("reserved runtime mode")

// ErrInvalidMode is returned by NormalizeRuntimeMode for any other unknown mode.
var ErrInvalidMode = errors.New("invalid runtime mode")

// NormalizeRuntimeMode accepts only the implemented modes. The guard stays
// until a reserved mode has a complete, tested contract.
func NormalizeRuntimeMode(mode string) (string, error) {
	switch mode {
	case ModeStateless, ModeSticky:
		return mode, nil
	case "soft_sticky", "pinned", "hybrid":
		return "", fmt.Errorf("%w: %q is reserved and not implemented", ErrReservedMode, mode)
	default:
		return "", fmt.Errorf("%w: %q (want stateless or sticky)", ErrInvalidMode, mode)
	}
}
