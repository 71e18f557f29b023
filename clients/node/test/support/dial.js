// A child process for the tests that reach a fake hub over https: it dials
// with the options on its stdin (JSON: hubURL, sessionID) and prints the
// outcome on its stdout (JSON: the error's name, status, code, instanceURL
// and message, whether it is a MarconiError, and every line logged). Its
// parent starts it with NODE_EXTRA_CA_CERTS naming the fake hub's
// certificate, so that this process trusts that certificate besides the
// usual ones, and checks every certificate as a user's would.

import { text } from 'node:stream/consumers';
import { MarconiError, dial } from '@marconihub/client';

const opts = JSON.parse(await text(process.stdin));
/** @type {{level: string, msg: string}[]} */
const logs = [];
const line = (/** @type {string} */ level) => (/** @type {string} */ msg) => { logs.push({ level, msg }); };
const logger = { debug: line('debug'), info: line('info'), warn: line('warn'), error: line('error') };
/** @type {any} */
let error = null;
try {
  const c = await dial({ hubURL: opts.hubURL, apiKey: 'key', surface: 'claude_code', sessionID: opts.sessionID, onSignal: () => {}, logger });
  await c.close();
} catch (e) {
  const err = /** @type {any} */ (e);
  error = {
    name: err?.name, message: String(err?.message), cause: String(err?.cause?.message ?? ''),
    marconiError: e instanceof MarconiError, status: err?.status, code: err?.code, instanceURL: err?.instanceURL,
  };
}
process.stdout.write(JSON.stringify({ error, logs }));
