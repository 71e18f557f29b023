package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// healthcheck is `marconi healthcheck URL`: for container health checks on
// images without curl.
func healthcheck(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return usagef("usage: marconi healthcheck URL")
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", args[0], resp.Status)
	}
	return nil
}

// attach is `marconi attach HUB_URL SESSION_TOKEN`: a minimal WebSocket
// client for the README tour and for debugging. It prints every frame and
// acks each signal after printing it.
func attach(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) != 2 {
		return usagef("usage: marconi attach HUB_URL SESSION_TOKEN")
	}
	u := strings.TrimRight(args[0], "/")
	u = "ws" + strings.TrimPrefix(strings.TrimPrefix(u, "http"), "ws") + "/v1/ws"
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + args[1]}}})
	if err != nil {
		if resp != nil {
			body, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("attach refused: %s %s", resp.Status, strings.TrimSpace(string(body)))
		}
		return err
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				c.Close(websocket.StatusNormalClosure, "bye")
				return nil
			}
			return fmt.Errorf("connection ended: %w", err)
		}
		fmt.Fprintln(stdout, string(data))
		var f struct {
			Type string `json:"type"`
			Seq  int64  `json:"seq"`
		}
		if json.Unmarshal(data, &f) == nil && f.Type == "signal" {
			ack, _ := json.Marshal(map[string]any{"type": "ack", "up_to_seq": f.Seq})
			if err := c.Write(ctx, websocket.MessageText, ack); err != nil {
				return err
			}
		}
	}
}
