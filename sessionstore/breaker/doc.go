// Package breaker is a circuit breaker around a sessionstore.Store, so that
// a store partition (packets dropped, not refused) costs one store timeout,
// not one per call: after a call times out or finds the store unreachable,
// every call fails at once with sessionstore.ErrUnavailable (the hub answers
// 503 registry_unavailable) until a probe of the store succeeds again.
// Ready, which /readyz asks, fails only once the store is found unreachable,
// not while it is merely slow. cmd/marconi wraps the Postgres store in it;
// its probe loop is Run, which the caller owns and waits for.
package breaker
