// npm test: builds the hub from this tree once (unless MARCONI_TEST_BIN
// already names one), then runs every test file with it, so that the files
// do not each build it again (about 3 s apiece with a warm Go cache).

import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { buildGo } from './hub.js';

const testDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
let cleanup = async () => {};
if (!process.env.MARCONI_TEST_BIN) {
  const built = await buildGo({ marconi: './cmd/marconi' });
  process.env.MARCONI_TEST_BIN = built.bins.marconi;
  cleanup = built.cleanup;
}
const files = readdirSync(testDir).filter((f) => f.endsWith('.test.js')).sort().map((f) => path.join(testDir, f));
const res = spawnSync(process.execPath, ['--test', '--test-concurrency=1', '--test-timeout=120000', ...files], { stdio: 'inherit' });
await cleanup();
process.exitCode = res.status ?? 1;
