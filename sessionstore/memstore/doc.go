// Package memstore is the in-memory sessionstore.Store: the embedded default
// that lets `go run ./cmd/marconi` work with nothing else installed.
//
// Nothing is durable: a restart forgets every session, key and signal. It
// serves one hub instance only, since nothing is shared between processes.
// Use pgstore for durability and for several instances.
package memstore
