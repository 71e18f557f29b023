package main

import (
	"context"
	"errors"
	"io"
)

// demo is `marconi demo`: see demo_story.go once the client lands.
func demo(ctx context.Context, args []string, stdout io.Writer) error {
	return errors.New("the demo is not built yet")
}
