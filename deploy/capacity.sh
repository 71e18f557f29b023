#!/usr/bin/env bash
# Capacity run behind docs/operations.md's capacity plan: N hub instances (1, or 3 behind
# deploy/haproxy.cfg) on one local Postgres, loaded by marconi-bench. Loopback only.
#   [GOMAXPROCS=n] deploy/capacity.sh [instances=1|3] [agents=300] [sends/s per agent=3] [duration=20s]
# GOMAXPROCS, when set, is each hub's (docs/operations.md: an instance's share of the cores);
# the load generator runs without it, with Go's default (the machine's cores), so that the
# hubs' setting is what a run measures.
# CAPACITY_PUBLIC_URL=balancer|direct (three instances; default balancer) is what each instance
# publishes as MARCONI_PUBLIC_URL: its balancer path http://LB/i/hub-N, so holder-routed sends
# cross HAProxy, or its own http://127.0.0.1:PORT, so they skip it (docs/operations.md, "Behind a
# load balancer").
# CAPACITY_ACK_INTERVAL=D (a Go duration, e.g. 250ms; default the client's) is the load's agents'
# AckInterval (docs/client.md, "Receiving"): the least time between two of an agent's acks.
# CAPACITY_PROJECTS=N (1..64; default 1) spreads the agents over N projects of tenant t1, agent i
# in project i mod N sending to the next agent of its project, as `marconi-bench fleet -projects N`
# does: behind deploy/haproxy.cfg, which keeps each project on one instance, N projects spread the
# load over the three instances (docs/operations.md, "Behind a load balancer"). More than 1 needs a
# marconi-bench that takes -projects (CAPACITY_BIN_DIR's too).
# CAPACITY_BIN_DIR=DIR runs DIR/marconi and DIR/marconi-bench as they are (built by the caller).
# Otherwise, from a clean checkout (no change and no untracked file, as git status says), the two
# are built once per commit and Go version into CAPACITY_CACHE_DIR (default
# ${XDG_CACHE_HOME:-~/.cache}/marconi-capacity) and reused by later runs; with uncommitted changes
# they are built afresh for each run, and not kept.
# Needs psql and curl, Postgres on 127.0.0.1:5432 (user postgres, trust), haproxy for 3.
set -euo pipefail
N=${1:-1}; AGENTS=${2:-300}; RATE=${3:-3}; DUR=${4:-20s}
PUBLIC=${CAPACITY_PUBLIC_URL:-balancer}
ACK=${CAPACITY_ACK_INTERVAL:-0}
PROJECTS=${CAPACITY_PROJECTS:-1}
[[ $PROJECTS =~ ^[1-9][0-9]?$ ]] && [ "$PROJECTS" -le 64 ] || { echo "CAPACITY_PROJECTS=$PROJECTS: want a number of projects, 1..64" >&2; exit 2; }
[[ $ACK =~ ^(0|[0-9]+(ns|us|ms|s|m))$ ]] || { echo "CAPACITY_ACK_INTERVAL=$ACK: want a duration such as 250ms" >&2; exit 2; }
case $PUBLIC in
  balancer|direct) ;;
  *) echo "CAPACITY_PUBLIC_URL=$PUBLIC: want balancer or direct" >&2; exit 2 ;;
esac
BIN=${CAPACITY_BIN_DIR:-}
if [ -n "$BIN" ]; then
  for b in marconi marconi-bench; do
    [ -f "$BIN/$b" ] && [ -x "$BIN/$b" ] || { echo "CAPACITY_BIN_DIR=$BIN: no executable $b there" >&2; exit 2; }
  done
  BIN=$(cd "$BIN" && pwd)
fi
cd "$(dirname "$0")/.."
D=$(mktemp -d)
build() { go build -o "$1/marconi" ./cmd/marconi && go build -o "$1/marconi-bench" ./cmd/marconi-bench; }
if [ -n "$BIN" ]; then
  echo "binaries: $BIN (CAPACITY_BIN_DIR)"
elif rev=$(git rev-parse HEAD 2>/dev/null) && [ -z "$(git status --porcelain 2>/dev/null)" ]; then
  BIN=${CAPACITY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/marconi-capacity}/$rev-$(go env GOVERSION)
  if [ -x "$BIN/marconi" ] && [ -x "$BIN/marconi-bench" ]; then
    echo "binaries: $BIN (built before from $rev, a clean tree)"
  else
    mkdir -p "$(dirname "$BIN")"
    tmp=$(mktemp -d "$BIN.XXXXXX")
    build "$tmp" || { rm -rf "$tmp"; exit 1; }
    rm -rf "$BIN" # an incomplete one
    mv -T "$tmp" "$BIN" 2>/dev/null || rm -rf "$tmp" # or another run's, just in place
    echo "binaries: $BIN (built from $rev, a clean tree; later runs reuse them)"
  fi
else
  BIN=$D
  build "$BIN"
  echo "binaries: built into $D for this run (uncommitted changes, or no git checkout)"
fi
DB=marconi_capacity_$$
psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE $DB" postgres
URL="postgres://postgres@127.0.0.1:5432/$DB?sslmode=disable"
KEY=mak_bench_local_only
# One API key per project: the hubs' MARCONI_API_KEYS (key=t1/pN, ...) and the load's keys.
HUB_KEYS=$KEY=t1/p1; BENCH_KEYS=$KEY
for p in $(seq 2 "$PROJECTS"); do HUB_KEYS+=",${KEY}_p$p=t1/p$p"; BENCH_KEYS+=",${KEY}_p$p"; done
BENCH_PROJECTS=(); [ "$PROJECTS" = 1 ] || BENCH_PROJECTS=(-projects "$PROJECTS")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" postgres || true
  [ -n "${KEEP:-}" ] && echo "logs in $D" || rm -rf "$D"
}
trap cleanup EXIT
LB=127.0.0.1:19080
for i in $(seq 1 "$N"); do
  port=$((19080 + i))
  pub=http://127.0.0.1:$port
  [ "$N" = 1 ] || [ "$PUBLIC" = direct ] || pub=http://$LB/i/hub-$i
  MARCONI_MODE=lan MARCONI_ADDR=127.0.0.1:$port MARCONI_DATABASE_URL=$URL MARCONI_INSTANCE_ID=hub-$i \
    MARCONI_PUBLIC_URL=$pub MARCONI_API_KEYS=$HUB_KEYS MARCONI_ADMIN_TOKEN=capacity-admin-token-0123 \
    MARCONI_SEND_RATE_PER_SECOND=100000 MARCONI_MAX_CONNECTIONS_PER_ADDRESS=100000 \
    MARCONI_QUOTA_REGISTRATIONS_PER_SECOND=100000 MARCONI_LOG_LEVEL=error \
    "$BIN/marconi" serve >"$D/hub-$i.log" 2>&1 &
  pids+=($!)
done
for i in $(seq 1 "$N"); do until curl -sf "http://127.0.0.1:$((19080 + i))/readyz" >/dev/null; do sleep 0.2; done; done
HUB=http://127.0.0.1:19081
if [ "$N" != 1 ]; then
  (cd deploy && MARCONI_LB_BIND=$LB MARCONI_LB_STATS=127.0.0.1:19404 MARCONI_HUB_1=127.0.0.1:19081 \
    MARCONI_HUB_2=127.0.0.1:19082 MARCONI_HUB_3=127.0.0.1:19083 exec haproxy -db -f haproxy.cfg >"$D/haproxy.log" 2>&1) &
  pids+=($!)
  until curl -sf "http://$LB/readyz" >/dev/null; do sleep 0.2; done
  HUB=http://$LB
fi
echo "hubs: GOMAXPROCS=${GOMAXPROCS:-default}; load generator: GOMAXPROCS=default"
[ "$N" = 1 ] || echo "public URLs: $PUBLIC"
echo "projects: $PROJECTS"
MARCONI_BENCH_API_KEY=$BENCH_KEYS env -u GOMAXPROCS "$BIN/marconi-bench" -hub "$HUB" -agents "$AGENTS" -rate "$RATE" -duration "$DUR" \
  -ack-interval "$ACK" "${BENCH_PROJECTS[@]}" -database-url "$URL"
for i in $(seq 1 "$N"); do echo "hub-$i CPU time: $(ps -o cputime= -p "${pids[$((i - 1))]}")"; done
