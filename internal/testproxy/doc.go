// Package testproxy is a TCP proxy for tests that need to break the network
// between the hub and Postgres (or anything else) on demand: cut every
// connection and refuse new ones, or freeze the live ones into a half-open
// route that stays open but carries no bytes.
package testproxy
