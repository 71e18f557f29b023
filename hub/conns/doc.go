// Package conns is Marconi's connection hub: the registry of the WebSockets
// attached to this instance, one Conn per connection owning its loops
// (catch-up, live writes, keepalive, close), replace and kick as Disconnect
// values, cross-instance wake-ups, the pending sweep and the expiry check
// (expiry.go). Hub implements signals.Router.
//
// conns knows sessionstore, signals and fabric's wake-up bus, and declares
// the store methods it calls as Store; hub wires it to the HTTP server
// (authentication and placement stay there).
package conns
