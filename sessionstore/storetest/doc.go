// Package storetest is the conformance suite of sessionstore.Store. Every
// implementation (memstore always, pgstore against a real Postgres) runs
// storetest.Run from its own tests, so the two stores cannot drift apart: a
// behaviour the hub relies on is pinned here once, by the contract's doc
// comments, and checked against both.
//
// The suite assumes nothing about one implementation: it never relies on map
// order, compares times with Equal after truncating them to the microsecond
// (what Postgres keeps), compares JSON payloads by meaning except where it
// pins that a payload round-trips byte for byte, and injects every "now"
// instead of sleeping.
package storetest
