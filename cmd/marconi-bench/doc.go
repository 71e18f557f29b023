// Command marconi-bench is a small load tool for a hub running on this
// machine: it attaches N agents with the Go client (bootstrap-client) over
// real HTTP and WebSocket, optionally has each send to the next at a fixed
// rate for a bounded time, and reports send and delivery latency and what the
// attached agents cost the hub process (from the hub's /metrics).
//
// It is bounded on purpose: loopback URLs only, at most 2000 agents, at most
// five minutes of load and 5000 sends a second in all. docs/benchmarks.md
// shows how its numbers were produced.
//
//	MARCONI_API_KEYS=mak_bench_local_only=t1/p1 MARCONI_ADDR=127.0.0.1:18080 GOGC=10 marconi serve &
//	MARCONI_BENCH_API_KEY=mak_bench_local_only marconi-bench -hub http://127.0.0.1:18080 -agents 1000 -rate 0
package main
