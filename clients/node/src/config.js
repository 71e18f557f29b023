// The client's configuration: the defaults in one place, every field checked once.

/** Defaults of the optional Config fields, in one place. */
export const defaults = Object.freeze({
  reconnectBaseDelayMs: 250,
  reconnectMaxDelayMs: 15000,
  reconnectRestartMaxDelayMs: 4000,
  requestTimeoutMs: 30000,
  sendAttempts: 4,
  pingIntervalMs: 20000,
  pingTimeoutMs: 10000,
  rateLimitWaitMs: 60000,
  holderHints: 1024,
  holderRetryAfterMs: 30000,
  ackIntervalMs: 500,
});

/**
 * @typedef {import('../index.js').Config} Config
 * @typedef {Required<Pick<Config, keyof typeof defaults>> & Config} Settled a Config with every default filled in
 */

const noop = () => {};
const silent = { debug: noop, info: noop, warn: noop, error: noop };

/**
 * Checks config and fills in its defaults. Returns it with the hub URLs it
 * names (hubURL, then hubURLs, each once, without trailing slashes) and its
 * logger with every level present. A bad field throws a TypeError naming it.
 * @param {Config} config
 * @returns {{cfg: Settled, urls: string[], log: Required<import('../index.js').Logger>}}
 */
export function settle(config) {
  const urls = hubURLs(config);
  if (!config.apiKey) throw new TypeError('marconi: apiKey is required');
  if (!config.surface) throw new TypeError('marconi: surface is required');
  const cfg = {
    ...config,
    reconnectBaseDelayMs: config.reconnectBaseDelayMs ?? defaults.reconnectBaseDelayMs,
    reconnectMaxDelayMs: config.reconnectMaxDelayMs ?? defaults.reconnectMaxDelayMs,
    reconnectRestartMaxDelayMs: config.reconnectRestartMaxDelayMs ?? defaults.reconnectRestartMaxDelayMs,
    requestTimeoutMs: config.requestTimeoutMs ?? defaults.requestTimeoutMs,
    sendAttempts: config.sendAttempts ?? defaults.sendAttempts,
    pingIntervalMs: config.pingIntervalMs ?? defaults.pingIntervalMs,
    pingTimeoutMs: config.pingTimeoutMs ?? defaults.pingTimeoutMs,
    rateLimitWaitMs: config.rateLimitWaitMs ?? defaults.rateLimitWaitMs,
    holderHints: config.holderHints ?? defaults.holderHints,
    holderRetryAfterMs: config.holderRetryAfterMs ?? defaults.holderRetryAfterMs,
    ackIntervalMs: config.ackIntervalMs ?? defaults.ackIntervalMs,
  };
  for (const k of /** @type {const} */ (['reconnectBaseDelayMs', 'reconnectMaxDelayMs', 'reconnectRestartMaxDelayMs', 'requestTimeoutMs', 'sendAttempts', 'pingTimeoutMs', 'holderHints', 'holderRetryAfterMs', 'ackIntervalMs'])) {
    if (!Number.isFinite(cfg[k]) || cfg[k] <= 0) throw new TypeError(`marconi: ${k} must be a positive number`);
  }
  if (!Number.isFinite(cfg.pingIntervalMs) || cfg.pingIntervalMs < 0) throw new TypeError('marconi: pingIntervalMs must be 0 (off) or a positive number');
  for (const k of /** @type {const} */ (['sendAttempts', 'holderHints'])) {
    if (!Number.isInteger(cfg[k])) throw new TypeError(`marconi: ${k} must be a whole number`);
  }
  if (config.noHolderRouting !== undefined && typeof config.noHolderRouting !== 'boolean') throw new TypeError('marconi: noHolderRouting must be a boolean');
  if (!Number.isFinite(cfg.rateLimitWaitMs) || cfg.rateLimitWaitMs < 0) throw new TypeError('marconi: rateLimitWaitMs must be 0 (never wait) or a positive number');
  checkTokenKeeping(config);
  for (const k of /** @type {const} */ (['hubURL', 'apiKey', 'surface', 'sessionID', 'runtimeMode', 'clientID'])) {
    if (config[k] !== undefined && typeof config[k] !== 'string') throw new TypeError(`marconi: ${k} must be a string`);
  }
  if (config.reconnectMaxDelayMs === undefined) cfg.reconnectMaxDelayMs = Math.max(cfg.reconnectMaxDelayMs, cfg.reconnectBaseDelayMs);
  if (cfg.reconnectMaxDelayMs < cfg.reconnectBaseDelayMs) {
    throw new TypeError('marconi: reconnectMaxDelayMs is below reconnectBaseDelayMs');
  }
  // After a 1012 the ceiling is this one, raised to the base, never above the max.
  if (config.reconnectRestartMaxDelayMs === undefined) cfg.reconnectRestartMaxDelayMs = Math.max(cfg.reconnectRestartMaxDelayMs, cfg.reconnectBaseDelayMs);
  cfg.reconnectRestartMaxDelayMs = Math.min(cfg.reconnectRestartMaxDelayMs, cfg.reconnectMaxDelayMs);
  return { cfg, urls, log: { ...silent, ...bindLogger(config.logger) } };
}

/**
 * Checks the token keeping fields: tokenFile a path, tokenStore an object
 * with load and save, not both; takeover a boolean; onFatal a function.
 * @param {Config} config
 */
function checkTokenKeeping(config) {
  if (config.tokenFile !== undefined && (typeof config.tokenFile !== 'string' || config.tokenFile === '')) {
    throw new TypeError('marconi: tokenFile must be a path');
  }
  const ts = config.tokenStore;
  if (ts !== undefined && (ts === null || typeof ts.load !== 'function' || typeof ts.save !== 'function')) {
    throw new TypeError('marconi: tokenStore must have load() and save(token)');
  }
  if (ts !== undefined && config.tokenFile !== undefined) throw new TypeError('marconi: set tokenFile or tokenStore, not both');
  if (config.takeover !== undefined && typeof config.takeover !== 'boolean') throw new TypeError('marconi: takeover must be a boolean');
  if (config.onFatal !== undefined && typeof config.onFatal !== 'function') throw new TypeError('marconi: onFatal must be a function');
}

/**
 * @param {Config} config
 * @returns {string[]}
 */
function hubURLs(config) {
  /** @type {string[]} */
  const urls = [];
  for (const u of [config.hubURL, ...(config.hubURLs ?? [])]) {
    if (!u) continue;
    let parsed;
    try {
      parsed = new URL(u);
    } catch {
      parsed = null;
    }
    if (!parsed || (parsed.protocol !== 'http:' && parsed.protocol !== 'https:')) {
      throw new TypeError(`marconi: hub URL ${JSON.stringify(u)} is not an http(s) URL`);
    }
    const trimmed = u.replace(/\/+$/, '');
    if (!urls.includes(trimmed)) urls.push(trimmed);
  }
  if (urls.length === 0) throw new TypeError('marconi: hubURL (or hubURLs) is required');
  return urls;
}

/**
 * Binds the logger's methods so that console works as a logger.
 * @param {import('../index.js').Logger | undefined} l
 */
function bindLogger(l) {
  if (!l) return {};
  /** @type {Record<string, (msg: string, fields: object) => void>} */
  const out = {};
  for (const k of /** @type {const} */ (['debug', 'info', 'warn', 'error'])) {
    const fn = l[k];
    if (typeof fn === 'function') out[k] = fn.bind(l);
  }
  return out;
}
