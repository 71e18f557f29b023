// Package contract holds the hub to its published HTTP contract: its test
// drives real hubs through every endpoint and validates each request and
// answer against docs/openapi.yaml. It has no code of its own; it stands
// apart from hub's tests so that the validator library is built only here.
package contract
