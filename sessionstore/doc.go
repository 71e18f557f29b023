// Package sessionstore is the durable registry of the hub: sessions and their
// proof of life, API keys, signals with their per-recipient sequence, queue
// placement and hub instances.
//
// Store is the one contract that both implementations meet: memstore (the
// embedded default, nothing durable) and pgstore (Postgres, durable and shared
// by several hub instances). storetest.Run is the conformance suite that both
// pass. The store never reads a clock: every method that decides expiry or
// records a time takes it from the caller, so tests inject time.
package sessionstore
