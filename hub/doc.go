// Package hub is the HTTP face of Marconi: the echo server, its handlers,
// credentials, the WebSocket attach and the per-session queue registry.
//
// hub knows sessionstore, signals and fabric; nothing imports hub but
// cmd/marconi (and tests, through hubtest). Handlers decode and validate the
// wire format, authenticate the caller, hand typed requests to signals and
// fabric, and map their errors onto the one error shape of docs/api.md.
package hub
