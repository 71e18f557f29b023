package fabric

import (
	"errors"
	"fmt"

	"github.com/marconihub/marconi"
)

// Mode is a session's runtime mode, the root package's word.
type Mode = marconi.RuntimeMode

// Runtime modes that are implemented.
const (
	ModeStateless = marconi.RuntimeStateless
	ModeSticky    = marconi.RuntimeSticky
)

// ModeSource is what chose a session's runtime mode, the root package's word.
type ModeSource = marconi.ModeSource

// Sources of a session's runtime mode.
const (
	SourceExplicit = marconi.SourceExplicit
	SourceAdaptive = marconi.SourceAdaptive
	SourceDefault  = marconi.SourceDefault
)

// ErrReservedMode is returned by NormalizeRuntimeMode for soft_sticky, pinned
// and hybrid: named by the recovery matrix but not implemented.
var ErrReservedMode = errors.New("reserved runtime mode")

// ErrInvalidMode is returned by NormalizeRuntimeMode for any other unknown mode.
var ErrInvalidMode = errors.New("invalid runtime mode")

// NormalizeRuntimeMode accepts only the implemented modes. The guard stays
// until a reserved mode has a complete, tested contract.
func NormalizeRuntimeMode(mode Mode) (Mode, error) {
	switch mode {
	case ModeStateless, ModeSticky:
		return mode, nil
	case "soft_sticky", "pinned", "hybrid":
		return "", fmt.Errorf("%w: %q is reserved and not implemented", ErrReservedMode, mode)
	default:
		return "", fmt.Errorf("%w: %q (want stateless or sticky)", ErrInvalidMode, mode)
	}
}
