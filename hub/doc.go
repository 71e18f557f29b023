// Package hub is the HTTP face of Marconi: the echo server, its handlers,
// credentials and the wiring of the connection hub (hub/conns), which owns
// the attached WebSockets.
//
// hub knows sessionstore, sessions, signals, fabric and hub/conns; nothing
// imports hub but cmd/marconi (and tests, through hubtest). Handlers decode
// and validate the wire format, authenticate the caller, hand typed requests
// to sessions, signals, fabric and conns, and map their errors onto the one
// error shape of docs/api.md.
package hub
