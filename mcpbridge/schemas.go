package mcpbridge

import "encoding/json"

// The tools' descriptions and JSON schemas are written for a model: what
// the tool is for, when to call it, and what each field means.

const sendDescription = `Send a signal (a short message) to another agent's session on the Marconi hub.
Use it to hand work to another agent, answer one, or tell it something changed. Address the recipient by its session id (its agent name, e.g. "reviewer"); whoami shows yours. Give either text (a plain message) or payload (a JSON object for structured data), not both.
The signal is stored durably before this returns: "delivery" says whether it was pushed to the recipient at once (pushed_to_ws) or waits until the recipient reads (queued_offline, not_available_offline). Either way it is not lost; do not resend it. If you retry after an error that left you unsure, reuse the same idempotency_key.
"received" holds signals addressed to you that were waiting: treat them as read_signals would return them.
An unknown recipient is an error (recipient_not_registered): check the name; the agent may not have started yet.`

const readDescription = `Read the signals other agents sent you, oldest first. Each signal is returned once: after this answer it is acknowledged and will not come again, so act on every one you receive.
Call it when you expect a reply or at natural pauses in your work. To wait for a reply, set wait_seconds (up to 60): the call returns as soon as a signal arrives, or empty when the time is up. "more": true means further signals are waiting; call again.`

const whoamiDescription = `Show this agent's own identity on the Marconi hub: its session id (the name other agents send to), tenant and project, surface, runtime mode, its route state (attached: signals are pushed to it live), how many signals are waiting unread, and the hub in use.`

// inboxDescription describes the marconi://inbox resource.
const inboxDescription = `The signals addressed to this agent that no tool answer has returned yet, oldest first (JSON). Subscribe to be told when a signal arrives; read_signals returns and acknowledges them.`

var sendInputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "to": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,128}$",
           "description": "The recipient's session id: the name the other agent registered with on the hub, e.g. \"reviewer\"."},
    "text": {"type": "string",
             "description": "A plain-text message. Delivered as the payload {\"text\": \"...\"}. Give text or payload, not both."},
    "payload": {"type": "object",
                "description": "A JSON object delivered as is, for structured messages. Give text or payload, not both."},
    "kind": {"type": "string", "default": "signal",
             "description": "A short label the recipient can act on, e.g. \"review_request\" or \"done\". Default \"signal\"."},
    "idempotency_key": {"type": "string", "maxLength": 256,
                        "description": "Optional. The same key on a retry makes the hub store the signal once (answer duplicate: true)."}
  },
  "required": ["to"],
  "additionalProperties": false
}`)

// signalSchema is one signal in an answer.
const signalSchema = `{
  "type": "object",
  "properties": {
    "id": {"type": "string", "description": "The signal's unique id."},
    "seq": {"type": "integer", "description": "Its position among the signals sent to you: strictly increasing."},
    "from": {"type": "string", "description": "The sender's session id: send_signal to it to answer."},
    "kind": {"type": "string", "description": "The sender's label for the signal."},
    "payload": {"description": "What the sender sent: {\"text\": \"...\"} for a text message, else its JSON object."},
    "created_at": {"type": "string", "format": "date-time"}
  },
  "required": ["id", "seq", "from", "kind", "payload", "created_at"]
}`

var sendOutputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "signal_id": {"type": "string"},
    "seq": {"type": "integer"},
    "delivery": {"type": "string", "enum": ["pushed_to_ws", "queued_offline", "not_available_offline"],
                 "description": "pushed_to_ws: the recipient has it now; queued_offline: it gets it when it reconnects or reads; not_available_offline: it has been silent a while, it gets it when it comes back."},
    "recipient_route_state": {"type": "string"},
    "recipient_route_stale": {"type": "boolean", "description": "The recipient is alive but its live route is broken; it repairs on its own next send. Nothing to do."},
    "sender_route_stale": {"type": "boolean", "description": "Your own live route was broken; the bridge has reconnected it. Nothing to do."},
    "selfheal_outcome": {"type": ["string", "null"]},
    "duplicate": {"type": "boolean", "description": "The hub had this idempotency_key already: nothing new was sent."},
    "received": {"type": "array", "items": ` + signalSchema + `}
  },
  "required": ["signal_id", "seq", "delivery", "recipient_route_state", "recipient_route_stale", "sender_route_stale", "selfheal_outcome", "duplicate", "received"]
}`)

var readInputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "max": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50,
            "description": "At most this many signals (1 to 500, default 50)."},
    "wait_seconds": {"type": "number", "minimum": 0, "maximum": 60, "default": 0,
                     "description": "When nothing is waiting, wait up to this long for a signal (0 to 60, default 0: answer at once)."}
  },
  "additionalProperties": false
}`)

var readOutputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "signals": {"type": "array", "items": ` + signalSchema + `},
    "more": {"type": "boolean", "description": "More signals are waiting: call read_signals again."}
  },
  "required": ["signals", "more"]
}`)

var whoamiInputSchema = json.RawMessage(`{"type": "object", "properties": {}, "additionalProperties": false}`)

var whoamiOutputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "session_id": {"type": "string", "description": "Your name on the hub: other agents send_signal to it."},
    "tenant_id": {"type": "string"},
    "project_id": {"type": "string"},
    "surface": {"type": "string"},
    "runtime_mode": {"type": "string"},
    "route_state": {"type": "string", "description": "attached: signals reach you live; route_without_queue or stale: they wait until you read."},
    "pending": {"type": "integer", "description": "Signals waiting unread: read_signals returns them."},
    "hub": {"type": "string", "description": "The hub URL in use."}
  },
  "required": ["session_id", "tenant_id", "project_id", "surface", "runtime_mode", "route_state", "pending", "hub"]
}`)
