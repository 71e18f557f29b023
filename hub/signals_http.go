package hub

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub/conns"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
)

// signalJSON is the wire form of a signal, the one WebSocket frames carry.
type signalJSON = conns.Signal

func toSignalsJSON(sigs []sessionstore.Signal) []signalJSON {
	out := make([]signalJSON, len(sigs))
	for i, s := range sigs {
		out[i] = conns.WireSignal(s)
	}
	return out
}

type sendRequest struct {
	ToSession      string          `json:"to_session"`
	Kind           string          `json:"kind"`
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey string          `json:"idempotency_key"`
}

type selfhealJSON struct {
	Recipient *string `json:"recipient"`
	Sender    *string `json:"sender"`
}

type sendResponse struct {
	SignalID            string `json:"signal_id"`
	Seq                 int64  `json:"seq"`
	Delivery            string `json:"delivery"`
	RecipientRouteState string `json:"recipient_route_state"`
	// RecipientInstanceURL is the public URL of the instance holding the
	// recipient's queue, when it is attached on a healthy instance whose URL
	// is known: a hint where the sender's next sends to it are cheapest.
	RecipientInstanceURL string       `json:"recipient_instance_url,omitzero"`
	SelfhealOutcome      *string      `json:"selfheal_outcome"`
	RecipientRouteStale  bool         `json:"recipient_route_stale,omitzero"`
	SenderRouteStale     bool         `json:"sender_route_stale,omitzero"`
	Selfheal             selfhealJSON `json:"selfheal"`
	Duplicate            bool         `json:"duplicate"`
	Pending              []signalJSON `json:"pending"`
	// History is the token of the store's history pending was read under,
	// when it was read and the store keeps one.
	History string `json:"history,omitempty"`
}

func nullable[T ~string](s T) *string {
	if s == "" {
		return nil
	}
	v := string(s)
	return &v
}

// send is POST /v1/signals.
func (s *Server) send(c echo.Context) error {
	sender := session(c)
	if s.Draining() {
		return marconi.Errorf(marconi.CodeDraining, "this instance is draining; send through another")
	}
	if !s.limits.Allow(sender.Key) {
		return marconi.Errorf(marconi.CodeTooManyRequests, "more than %g sends a second from this session", s.cfg.SendRatePerSecond)
	}
	var req sendRequest
	// The payload limit applies to the payload; the body may carry the rest.
	if err := decodeSendBody(c, s.maxBodyBytes(), &req); err != nil {
		return err
	}
	res, err := s.signals.Send(c.Request().Context(), signals.SendRequest{
		Sender: sender, SenderTokenHash: tokenHash(c),
		To: req.ToSession, Kind: req.Kind, Payload: req.Payload, IdempotencyKey: req.IdempotencyKey,
	})
	if err != nil {
		return err
	}
	return writeSendAnswer(c, sendResponse{
		SignalID:             res.Signal.ID,
		Seq:                  res.Signal.Seq,
		Delivery:             string(res.Delivery),
		RecipientRouteState:  string(res.RouteState),
		RecipientInstanceURL: s.instanceURL(c.Request().Context(), res.RecipientInstance),
		SelfhealOutcome:      nullable(res.SelfHeal.Outcome),
		RecipientRouteStale:  res.SelfHeal.RecipientRouteStale,
		SenderRouteStale:     res.SelfHeal.SenderRouteStale,
		Selfheal:             selfhealJSON{Recipient: nullable(res.SelfHeal.Recipient), Sender: nullable(res.SelfHeal.Sender)},
		Duplicate:            res.Duplicate,
		Pending:              toSignalsJSON(res.Pending),
		History:              res.History,
	})
}

// instanceURL is the public URL of instance, from the members in memory;
// empty for none, an unknown one, or when this instance has no peers.
func (s *Server) instanceURL(ctx context.Context, instance string) string {
	if instance == "" || !s.peered {
		return ""
	}
	return s.fabric.Members.URL(ctx, instance)
}

type drainResponse struct {
	Signals        []signalJSON `json:"signals"`
	NextAfterSeq   int64        `json:"next_after_seq"`
	History        string       `json:"history,omitempty"`
	HistoryChanged bool         `json:"history_changed,omitzero"`
}

// drain is GET /v1/signals?after_seq=N&limit=M&history=H.
func (s *Server) drain(c echo.Context) error {
	sess := session(c)
	after, err := queryInt(c, "after_seq", 0)
	if err != nil {
		return err
	}
	limit, err := queryInt(c, "limit", int64(s.signals.Config().DrainLimit))
	if err != nil {
		return err
	}
	if limit < 1 {
		return marconi.Errorf(marconi.CodeInvalidField, "limit must be at least 1")
	}
	history := c.QueryParam("history")
	if err := checkHistory(history); err != nil {
		return err
	}
	res, err := s.signals.Drain(c.Request().Context(), signals.DrainRequest{
		Key: sess.Key, AfterSeq: after, Limit: int(min(limit, int64(s.signals.Config().DrainLimit))), History: history,
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, drainResponse{Signals: toSignalsJSON(res.Signals), NextAfterSeq: res.NextAfterSeq,
		History: res.History, HistoryChanged: res.HistoryChanged})
}

// checkHistory refuses a history token that is not one the hub hands out.
func checkHistory(h string) error {
	if !signals.ValidHistory(h) {
		return marconi.Errorf(marconi.CodeInvalidField, "history must be a token the hub gave (%s), or absent", signals.IDForm)
	}
	return nil
}

func queryInt(c echo.Context, name string, def int64) (int64, error) {
	v := c.QueryParam(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, marconi.Errorf(marconi.CodeInvalidField, "%s must be a non-negative integer", name)
	}
	return n, nil
}

type ackRequest struct {
	UpToSeq *int64 `json:"up_to_seq"`
	// History is the token of the store's history the acknowledged signals
	// came under; "" checks none.
	History string `json:"history"`
}

// ack is POST /v1/signals/ack.
func (s *Server) ack(c echo.Context) error {
	sess := session(c)
	var req ackRequest
	if err := decodeBody(c, 4<<10, &req); err != nil {
		return err
	}
	if req.UpToSeq == nil || *req.UpToSeq < 0 {
		return marconi.Errorf(marconi.CodeInvalidField, "up_to_seq is required and must be a non-negative integer")
	}
	if err := checkHistory(req.History); err != nil {
		return err
	}
	n, err := s.signals.AckUnder(c.Request().Context(), sess.Key,
		sessionstore.Holder{RegisteredAt: sess.RegisteredAt, TokenHash: tokenHash(c)}, *req.UpToSeq, req.History)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]int{"acked": n})
}
