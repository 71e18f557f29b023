// Package pgstore is the Postgres implementation of sessionstore.Store: the
// durable registry that several hub instances share.
//
// It expects the schema of package migrations at its latest version, in the
// schema named first in the connection's search_path. It fails closed: when
// Postgres cannot be reached every call returns an error wrapping
// sessionstore.ErrUnavailable within the connect timeout (or the caller's
// deadline), and it recovers by itself once Postgres is back, without being
// reopened. Every time it records or compares comes from the caller, never
// from Postgres's clock, so tests can inject time.
package pgstore
