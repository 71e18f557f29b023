// Package mcpbridge is `marconi mcp`: an MCP server (Model Context
// Protocol) that puts one agent of an MCP host (Claude Code, Codex, Cursor)
// on the hub. It holds the agent's session through the Go client
// (bootstrap-client), so SPEC-168's reconnect on sender_route_stale happens
// inside it, and offers the agent three tools (send_signal, read_signals,
// whoami) and one subscribable resource (marconi://inbox). docs/mcp.md is
// the user's guide; docs/api.md "The MCP bridge" the contract.
//
// Signals reach the bridge through the client with acknowledging deferred
// (bootstrap.Config.DeferAck): they wait in a bounded inbox until a tool
// answer returns them to the host, and are acknowledged on the hub only after
// that answer was written, so a host that dies before reading loses nothing.
package mcpbridge
