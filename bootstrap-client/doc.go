// Package bootstrap is the Go client of the Marconi hub: it registers (or
// resumes) a session, holds the session's one WebSocket ("bootstrap"
// connection), heartbeats, sends signals over HTTP and hands every signal
// addressed to the session to one handler.
//
// It shares nothing with the hub but the wire contract (docs/api.md): it
// imports no server package. What it does on each hub answer:
//
//   - sender_route_stale: true in a send answer: the hub has no queue for this
//     session although it is alive (SPEC-168 AC-4). The client closes its
//     WebSocket and runs the connect sequence again, once per connection even
//     when many concurrent sends report it.
//   - recipient_route_stale: true alone: logged; the recipient repairs its own
//     route on its next send.
//   - a dropped WebSocket: redialed with exponential backoff and full jitter
//     (Config.ReconnectBaseDelay, Config.ReconnectMaxDelay); close code 1012
//     (hub restarting) and abnormal closes included. While it is down, the
//     client drains its signals over HTTP.
//   - no pong within Config.PingTimeout of a keepalive ping
//     (Config.PingInterval): the path died silently; the connection is
//     closed and redialed with the backoff, counted in Stats.PingTimeouts.
//   - close code 4409 (replaced by a newer connection of this session): not
//     redialed; the client does not fight the newer connection (OnFatal).
//   - 410 session_expired from any call, or close code 4410: the same
//     session_id is registered again, the WebSocket reattached, and
//     Config.OnAffinityReset called (whatever the session held is gone).
//   - no answer (connection failed) or 502, 503, 504 on any call: the next
//     call goes to the next of Config.HubURL and Config.HubURLs (failover);
//     Send itself retries, with the same idempotency key, up to
//     Config.SendAttempts times.
//   - welcome with affinity_reset: true: Config.OnAffinityReset is called; the
//     application rehydrates its runtime-local state. A welcome's "dropped": n
//     (disconnect policy drop) is logged at warn level and summed in
//     Stats.DroppedAtReset.
//   - recipient_instance_url in a send answer: that recipient's next signals
//     go to that instance (the one holding its queue), with the same token;
//     an answer without it sends them through the hub URL again. A send that
//     certainly never reached that instance (dial failed, a balancer's own
//     502/503) goes through the hub URL at once, and the URL is left alone
//     for Config.HolderRetryAfter; any other failure is Send's as above.
//     Config.NoHolderRouting turns it off.
//   - 409 wrong_instance on attach (sticky session): instance_url is followed,
//     but not pinned: every reattach starts at the hub URL in use again, so
//     when the assigned instance dies, that URL's instance takes the session
//     over once it sees the dead one gone (within about half a second of a
//     kill with Postgres).
//   - 429 to a registration or a send: waited out for its Retry-After (the
//     backoff when the header is missing or unreadable) and made again,
//     within Config.RateLimitWait and ctx; a longer wait returns the 429.
//   - 403 to Dial's registration (the id is live under a token the client
//     does not hold): with Config.Takeover, registered again with
//     "takeover": true; OnAffinityReset is called.
//   - refused for good while reconnecting (400, 401, 403, 404), or close
//     4409: Config.OnFatal is called once, with the hub's *Error or
//     ErrReplaced.
//
// Config.TokenStore keeps the session token across runs (FileTokenStore: a
// 0600 file): Dial resumes with a kept token, and every new token is saved.
//
// Delivery is at least once on the wire; the client turns it into once per
// signal id for the handler: signals from the WebSocket, from drain and from
// piggyback (pending in send and heartbeat answers) reach Config.OnSignal in
// seq order, each id once, from a single goroutine, and are acknowledged after
// the handler returns.
package bootstrap
