#!/usr/bin/env bash
# Installs @marconihub/client into fresh projects outside this repository, the
# ways docs/client.md gives, and checks that each can import it and construct
# a client's WebSocket dependency:
#   1. npm install --install-links <abs path>   (a copy: ws in the project)
#   2. npm pack, then npm install <the .tgz>      (what a registry would serve)
#   3. npm install <abs path>                     (a symlink: ws from the folder's
#      own node_modules, which must be installed: npm ci in clients/node)
# Offline-friendly: ws comes from npm's cache when it is there (--prefer-offline).
set -euo pipefail

pkg="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
npm_flags=(--no-audit --no-fund --prefer-offline --loglevel=error)

check() { # name dir
  (cd "$2" && node --input-type=module -e "
    import { dial, fileTokenStore, MarconiError } from '@marconihub/client';
    for (const [n, v] of Object.entries({ dial, fileTokenStore, MarconiError })) {
      if (typeof v !== 'function') { console.error('missing export ' + n); process.exit(1); }
    }
  ") || { echo "install check: $1: the client cannot be imported" >&2; exit 1; }
  echo "install check: $1: ok"
}

project() { # name
  mkdir -p "$work/$1"
  (cd "$work/$1" && npm init -y >/dev/null)
  echo "$work/$1"
}

p="$(project links)"
(cd "$p" && npm install "${npm_flags[@]}" --install-links "$pkg")
[ ! -L "$p/node_modules/@marconihub/client" ] || { echo "install check: --install-links made a symlink" >&2; exit 1; }
[ -d "$p/node_modules/ws" ] || { echo "install check: --install-links did not install ws in the project" >&2; exit 1; }
check "npm install --install-links <path>" "$p"

p="$(project tarball)"
tgz="$(cd "$work" && npm pack --silent "$pkg" | tail -n1)"
(cd "$p" && npm install "${npm_flags[@]}" "$work/$tgz")
[ -d "$p/node_modules/ws" ] || { echo "install check: the tarball's install did not install ws" >&2; exit 1; }
check "npm install <npm pack tarball>" "$p"

p="$(project link)"
(cd "$p" && npm install "${npm_flags[@]}" "$pkg")
check "npm install <path> (a symlink to the folder, its dependencies installed there)" "$p"
