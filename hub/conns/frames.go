package conns

import (
	"encoding/json"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// Signal is the wire form of a signal, in WebSocket frames and in HTTP
// answers alike.
type Signal struct {
	ID          string          `json:"id"`
	Seq         int64           `json:"seq"`
	FromSession string          `json:"from_session"`
	ToSession   string          `json:"to_session"`
	Kind        string          `json:"kind"`
	Payload     json.RawMessage `json:"payload"`
	CreatedAt   time.Time       `json:"created_at"`
}

// WireSignal is s in its wire form.
func WireSignal(s sessionstore.Signal) Signal {
	return Signal{ID: s.ID, Seq: s.Seq, FromSession: s.FromSession, ToSession: s.To.SessionID,
		Kind: s.Kind, Payload: s.Payload, CreatedAt: s.CreatedAt.UTC()}
}

// Welcome is the first frame of every attached connection.
type Welcome struct {
	Type          string `json:"type"`
	SessionID     string `json:"session_id"`
	InstanceID    string `json:"instance_id"`
	Resumed       bool   `json:"resumed"`
	AffinityReset bool   `json:"affinity_reset"`
	Replayed      int    `json:"replayed"` // counted by the hub when it records the attach
	Dropped       *int   `json:"dropped,omitempty"`
}

type signalFrame struct {
	Type string `json:"type"`
	Signal
}

type clientFrame struct {
	Type    string `json:"type"`
	UpToSeq *int64 `json:"up_to_seq"`
}

type errorFrame struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
}
