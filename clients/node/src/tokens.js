// Keeping the session token across restarts: a file (0600, replaced
// atomically) or the application's own store.

import { randomBytes } from 'node:crypto';
import { mkdir, open, readFile, rename, rm } from 'node:fs/promises';
import path from 'node:path';

/**
 * @typedef {import('../index.js').SessionToken} SessionToken
 * @typedef {import('../index.js').TokenStore} TokenStore
 */

/**
 * A TokenStore keeping the token in a JSON file at file ({session_id, token,
 * tenant_id, project_id}; an older client's file, without the last two,
 * still loads; one where either is not a string loads without both, naming
 * the field in dropped): readable by its owner only (0600), replaced atomically (a
 * temporary file renamed over it), its directory created (0700) when missing.
 * @param {string} file
 * @returns {TokenStore}
 */
export function fileTokenStore(file) {
  /** @type {Promise<void>} serializes the saves of this process */
  let saving = Promise.resolve();
  return {
    async load() {
      let text;
      try {
        text = await readFile(file, 'utf8');
      } catch (err) {
        if (/** @type {NodeJS.ErrnoException} */ (err).code === 'ENOENT') return null;
        throw err;
      }
      let t;
      try {
        t = JSON.parse(text);
      } catch {
        t = null;
      }
      if (!isToken(t)) throw new Error(`marconi: token file ${file} is not a kept session token`);
      /** @type {SessionToken} */
      const kept = { sessionID: t.session_id, token: t.token };
      // The tenant and project are routing hints: one of another JSON type
      // costs both hints, not the token (dial logs the field dropped).
      const bad = ['tenant_id', 'project_id'].find((f) => t[f] != null && typeof t[f] !== 'string');
      if (bad) {
        kept.dropped = bad;
        return kept;
      }
      if (t.tenant_id != null) kept.tenantID = t.tenant_id;
      if (t.project_id != null) kept.projectID = t.project_id;
      return kept;
    },
    save(t) {
      /** @type {Record<string, string>} */
      const fields = { session_id: t.sessionID, token: t.token };
      if (t.tenantID) fields.tenant_id = t.tenantID;
      if (t.projectID) fields.project_id = t.projectID;
      const next = saving.then(() => writeAtomically(file, JSON.stringify(fields)));
      saving = next.catch(() => {});
      return next;
    },
  };
}

/**
 * A kept token: a session id and a token, both strings. The tenant and
 * project are not checked here (an older client's file has neither; one of
 * another type is dropped by load): whether they are ids of the contract the
 * client decides (projectRoute), so that a bad one costs the balancer's
 * header, not the token.
 * @param {any} t
 */
function isToken(t) {
  return t !== null && typeof t === 'object' && typeof t.session_id === 'string' && typeof t.token === 'string' &&
    t.session_id !== '' && t.token !== '';
}

/**
 * Writes data to file through a temporary file in its directory, synced,
 * then renamed over it: a crash leaves the old content or the new, whole.
 * @param {string} file
 * @param {string} data
 */
async function writeAtomically(file, data) {
  const dir = path.dirname(file);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const tmp = path.join(dir, `.${path.basename(file)}.${randomBytes(6).toString('hex')}`);
  const fh = await open(tmp, 'wx', 0o600);
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  try {
    await rename(tmp, file);
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
}

/**
 * The token store config names: tokenStore, else a file store on tokenFile,
 * else none.
 * @param {import('../index.js').Config} config
 * @returns {TokenStore | null}
 */
export function tokenStoreOf(config) {
  if (config.tokenStore) return config.tokenStore;
  if (config.tokenFile) return fileTokenStore(config.tokenFile);
  return null;
}
