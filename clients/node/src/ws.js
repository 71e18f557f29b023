// The WebSocket library, imported so that a missing install says what to do.
//
// `npm install <folder>` makes node_modules/@marconihub/client a symlink to
// the folder, and Node resolves this package's imports from that real path:
// `ws` is then looked for beside the folder (its own node_modules), not in
// the project that installed it. docs/client.md gives the installs that
// work: a copy (--install-links, or the packed tarball) or the folder's own
// dependencies installed.

import { createRequire } from 'node:module';

/** @type {typeof import('ws').default} */
let WebSocket;
try {
  // require, not a static import: a missing package is caught here and
  // explained; and not a top-level await, which would keep require(esm) of
  // this package from working where Node supports it.
  WebSocket = createRequire(import.meta.url)('ws');
} catch (err) {
  if (/** @type {NodeJS.ErrnoException} */ (err).code !== 'MODULE_NOT_FOUND') throw err;
  throw new Error(
    "@marconihub/client: its dependency 'ws' is not installed where the client's files are " +
      `(${new URL('..', import.meta.url).pathname}). A folder install is a symlink: install with ` +
      "'npm install --install-links <path>' (a copy, as from a tarball), or run 'npm ci --omit=dev' in that folder.",
    { cause: err },
  );
}

export default WebSocket;
