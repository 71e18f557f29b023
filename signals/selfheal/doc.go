// Package selfheal holds the self-heal gates and token buckets of SPEC-168;
// it is observational only.
//
// On a send, the signals package asks an Evaluator whether the recipient and
// the sender each have a route without a queue that a client could repair by
// reconnecting. The Evaluator answers with the outcomes and the
// recipient_route_stale / sender_route_stale hints of the wire contract
// (docs/api.md, "Self-heal hints"), counts marconi_route_self_healed_total, and
// spends tokens from in-memory buckets keyed (side, tenant, project, session).
// It never closes or opens a connection and never changes how a signal is
// delivered: only the client reconnects, and only on sender_route_stale.
//
// The package knows nothing of HTTP, the store or the queue registry: the
// caller says whether each side has an attached queue and what its freshest
// proof of life was before the call.
package selfheal
