package fabric

import (
	"errors"
	"testing"
)

func TestNormalizeRuntimeMode(t *testing.T) {
	tests := []struct {
		in      Mode
		want    Mode
		wantErr error
	}{
		{"stateless", "stateless", nil},
		{"sticky", "sticky", nil},
		{"soft_sticky", "", ErrReservedMode},
		{"pinned", "", ErrReservedMode},
		{"hybrid", "", ErrReservedMode},
		{"", "", ErrInvalidMode},
		{"Sticky", "", ErrInvalidMode},
		{"roaming", "", ErrInvalidMode},
	}
	for _, tt := range tests {
		got, err := NormalizeRuntimeMode(tt.in)
		if got != tt.want || !errors.Is(err, tt.wantErr) {
			t.Errorf("NormalizeRuntimeMode(%q) = %q, %v; want %q, %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
