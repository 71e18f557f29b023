package bootstrap_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
)

// An agent registers, receives signals on one goroutine and sends one. It
// needs a running hub (go run ./cmd/marconi prints a development API key).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c, err := bootstrap.Dial(ctx, bootstrap.Config{
		HubURL:  "http://127.0.0.1:8080",
		APIKey:  "the-project-api-key",
		Surface: "claude_code",
		OnSignal: func(s bootstrap.Signal) {
			// Once per signal id, in seq order; acknowledged when this returns.
			fmt.Printf("signal %d from %s: %s\n", s.Seq, s.FromSession, s.Payload)
		},
		OnAffinityReset: func() {
			// The sticky instance changed: rebuild runtime-local state here.
		},
		Logger: slog.Default(),
	})
	if err != nil {
		var he *bootstrap.Error
		if errors.As(err, &he) {
			log.Fatalf("hub refused: %d %s", he.Status, he.Code)
		}
		log.Fatal(err)
	}
	defer c.Close() // detaches and stops the client's goroutines; the session stays registered

	res, err := c.Send(ctx, "other-agent", "review_request", map[string]string{"pr": "42"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Delivery, res.Seq)
}
