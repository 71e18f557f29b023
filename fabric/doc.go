// Package fabric holds the multi-instance side of the hub, one type per
// role, each built on the ones before it: Members (membership and liveness:
// the instance table, heartbeats, the liveness probe), Placer (placement
// and takeover of sticky sessions at attach), Canary (the adaptive
// classifier's gate and its rollback), and the Bus that carries wake-ups
// between instances (declared here, used by the connection hub). It also
// holds runtime modes and their normalization, following the MCP-Fabric
// mode recovery matrix: only stateless and sticky are implemented;
// soft_sticky, pinned and hybrid stay reserved and are rejected at the
// boundary.
package fabric
