// Command marconi-bench is a small load tool for a hub running on this
// machine: it attaches N agents with the Go client (bootstrap-client) over
// real HTTP and WebSocket, optionally has each send to the next at a fixed
// rate for a bounded time, and reports send and delivery latency and what the
// attached agents cost the hub process (from the hub's /metrics). Each
// agent's sends are due on a fixed schedule (a late one is made at once, and
// the next ones catch up), so the load offered is the rate asked for; the
// report gives what was offered beside what was sent, and a send still due
// when the time is up, because the hub fell behind, is not made.
//
// It is bounded on purpose: loopback URLs only, at most 2000 agents, at most
// five minutes of load and 5000 sends a second in all. docs/benchmarks.md
// shows how its numbers were produced.
//
//	MARCONI_API_KEYS=mak_bench_local_only=t1/p1 MARCONI_ADDR=127.0.0.1:18080 GOGC=10 marconi serve &
//	MARCONI_BENCH_API_KEY=mak_bench_local_only marconi-bench -hub http://127.0.0.1:18080 -agents 1000 -rate 0
//
// -projects N spreads the agents over N projects (agent i in project i mod
// N, sending to the next agent of its project); MARCONI_BENCH_API_KEY then
// lists N keys, comma-separated, one per project (deploy/capacity.sh's
// CAPACITY_PROJECTS).
//
// `marconi-bench compare` starts the hub (the marconi binary beside it, on
// the memory store), the floor (`marconi-bench floor`, a bare
// coder/websocket server that does no work) and, given -centrifugo, a
// Centrifugo v6, each as a process of its own on loopback; attaches -idle
// idle sessions to each and reads each one's RSS before and after; then runs
// -rounds interleaved rounds of -sends sequential sends (HTTP send or
// publish → WebSocket frame read) and prints the figures side by side with
// their ratios:
//
//	go build -o /tmp/mb/ ./cmd/marconi ./cmd/marconi-bench
//	/tmp/mb/marconi-bench compare -centrifugo /path/to/centrifugo -idle 3000 -sends 3000 -rounds 3
//
// `marconi-bench storm` is the reconnect storm: a hub on Postgres, -sessions
// Go clients attached, -signals sends, a restart of the hub that drops every
// WebSocket at once, then the time until all are attached again and a check
// that every signal sent (before and after the restart) arrived:
//
//	/tmp/mb/marconi-bench storm -database 'postgres://postgres@127.0.0.1:5432/storm?sslmode=disable' -sessions 9000
//
// `marconi-bench durable -jetstream NATS_SERVER` measures durable sends on
// Postgres beside NATS JetStream in one run: a hub and a nats-server of its
// own (loopback only, its store under a temporary directory, file storage
// with every acknowledged publish fsynced), the same senders and duration,
// -rounds rounds alternating the two, and Marconi's sends/s as a multiple of
// JetStream's acked publishes/s. The nats-server is built outside the
// repository (GOBIN=/tmp/ns go install github.com/nats-io/nats-server/v2@v2.15.2):
//
//	/tmp/mb/marconi-bench durable -marconi /tmp/mb/marconi -jetstream /tmp/ns/nats-server \
//	  -database-url 'postgres://postgres@127.0.0.1:5432/durable?sslmode=disable' -senders 64 -duration 10s -rounds 2
package main
