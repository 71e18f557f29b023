// Command goagent is the Go side of the Node client's interoperability test
// (clients/node/test/interop.test.js): a Go agent on bootstrap-client that
// prints one JSON line per signal it receives and answers each with an "echo"
// signal carrying the same payload back to its sender. It prints "ready" once
// attached and stops when its standard input closes.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
)

func main() {
	hubURL := flag.String("hub", "http://127.0.0.1:8080", "hub URL")
	session := flag.String("session", "go-agent", "session id")
	flag.Parse()
	if err := run(*hubURL, *session, os.Getenv("MARCONI_API_KEY"), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "goagent:", err)
		os.Exit(1)
	}
}

func run(hubURL, session, apiKey string, stdin io.Reader, stdout io.Writer) error {
	ctx := context.Background()
	received := make(chan bootstrap.Signal, 64)
	c, err := bootstrap.Dial(ctx, bootstrap.Config{
		HubURL: hubURL, APIKey: apiKey, SessionID: session, Surface: "claude_code",
		OnSignal: func(s bootstrap.Signal) { received <- s },
	})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintln(stdout, "ready")

	stdinDone := make(chan error, 1)
	go func() { // ends when stdin closes, which is also when run returns
		_, err := io.Copy(io.Discard, stdin)
		stdinDone <- err
	}()
	for {
		select {
		case err := <-stdinDone:
			return err
		case s := <-received:
			line, _ := json.Marshal(map[string]any{"from": s.FromSession, "kind": s.Kind, "seq": s.Seq, "payload": s.Payload})
			fmt.Fprintf(stdout, "%s\n", line)
			if _, err := c.Send(ctx, s.FromSession, "echo", s.Payload); err != nil {
				fmt.Fprintf(stdout, "{\"error\": %q}\n", err.Error())
			}
		}
	}
}
