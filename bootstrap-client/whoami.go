package bootstrap

import (
	"context"
	"fmt"
	"net/http"

	"github.com/marconihub/marconi"
)

// Registration is what the hub answered to the session's last registration
// or resume: who the session is and how the hub placed it.
type Registration struct {
	SessionID, TenantID, ProjectID, Surface, RuntimeMode string
}

// registrationOf is the Registration of a hub's answer.
func registrationOf(a marconi.SessionAnswer) Registration {
	return Registration{SessionID: a.SessionID, TenantID: a.TenantID, ProjectID: a.ProjectID,
		Surface: string(a.Surface), RuntimeMode: string(a.RuntimeMode)}
}

// Registration returns what the hub said of the session when it last
// registered or resumed it.
func (c *Client) Registration() Registration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.registration
}

// HubURL is the hub URL the client uses now (it moves on failover).
func (c *Client) HubURL() string {
	u, _ := c.hub()
	return u
}

// Heartbeat proves the session alive now (POST /v1/heartbeat), as the
// client's own loop does on its interval, hands the pending signals of the
// answer to OnSignal, and returns the session's route state as the hub sees
// it: attached, route_without_queue or stale.
func (c *Client) Heartbeat(ctx context.Context) (string, error) {
	if c.ctx.Err() != nil {
		return "", errClosed
	}
	var res heartbeatResponse
	a, err := c.sessionCall(ctx, http.MethodPost, "/v1/heartbeat", nil, &res)
	if err != nil {
		return "", fmt.Errorf("bootstrap: heartbeat: %w", err)
	}
	if len(res.Pending) > 0 {
		c.offer(delivery{signals: res.Pending, epoch: a.epoch})
	}
	return res.RouteState, nil
}
