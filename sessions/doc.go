// Package sessions is the hub's session service: registration (create,
// resume with the current token, the retry of a registration whose answer
// was lost, takeover by the project's API key), heartbeat and
// deregistration, with the session quotas (live sessions per project,
// registrations per second per API key). It takes typed requests, returns
// typed results and marconi.Error codes, and knows nothing of HTTP: hub
// decodes, calls it and encodes (docs/api.md, "Sessions").
//
// Beside signals.Service; it reaches the store, the fabric and the
// connections through the small interfaces it declares (Store, Placer,
// Revoker), shares the identifier and surface rules of signals, and never
// imports hub.
package sessions
