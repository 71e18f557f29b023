// Package fabric holds the multi-instance side of the hub: runtime modes and
// their normalization, instance health, placement of sticky sessions, the
// adaptive classifier and the fabric summary. It follows the MCP-Fabric mode
// recovery matrix: only stateless and sticky are implemented; soft_sticky,
// pinned and hybrid stay reserved and are rejected at the boundary.
package fabric
