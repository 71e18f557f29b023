// Type declarations of @marconihub/client (the Node client of the Marconi hub).
// The implementation is plain JavaScript in src/; docs/client.md describes it.

import { EventEmitter } from 'node:events';

/**
 * Wire words of the hub where it has a closed set (docs/api.md). They are the
 * Go root package's words; a Go test holds the two to the same spelling.
 */

/** An error code: every one the hub answers, and the client's own unexpected_response. */
export type ErrorCode =
  | 'invalid_json'
  | 'invalid_field'
  | 'invalid_surface'
  | 'invalid_runtime_mode'
  | 'reserved_runtime_mode'
  | 'unauthorized'
  | 'forbidden'
  | 'recipient_not_registered'
  | 'not_found'
  | 'wrong_instance'
  | 'not_adaptive_placement'
  | 'history_changed'
  | 'session_expired'
  | 'payload_too_large'
  | 'request_timeout'
  | 'too_many_requests'
  | 'quota_exceeded'
  | 'registry_unavailable'
  | 'draining'
  | 'upgrade_required'
  | 'internal'
  | 'bad_request'
  | 'headers_too_large'
  | 'not_implemented'
  | 'http_version_not_supported'
  | 'unexpected_response';

/** What kind of agent a session is; a console is "console_" and a name. */
export type Surface = 'claude_code' | 'headless_cc' | 'headless_cx' | 'codex' | `console_${string}`;

/** A session's runtime mode; "" lets the hub choose. */
export type RuntimeMode = '' | 'stateless' | 'sticky';

/** How a send was classified. */
export type Delivery = 'pushed_to_ws' | 'queued_offline' | 'not_available_offline';

/** Whether the hub can reach a session. */
export type RouteState = 'attached' | 'route_without_queue' | 'stale' | 'not_registered';

/** One side's SPEC-168 self-heal outcome. */
export type SelfhealOutcome =
  | 'attempted'
  | 'succeeded'
  | 'no_listener'
  | 'rate_limited'
  | 'stale_recency'
  | 'unsupported_surface'
  | 'failed';

/** A WebSocket close code of the contract. */
export type CloseCode = 4401 | 4409 | 4410 | 4429 | 1012 | 1008 | 1009 | 1007;

/** Every error code, by name (src/codes.js). */
export declare const codes: Readonly<{
  invalidJSON: 'invalid_json';
  invalidField: 'invalid_field';
  invalidSurface: 'invalid_surface';
  invalidRuntimeMode: 'invalid_runtime_mode';
  reservedRuntimeMode: 'reserved_runtime_mode';
  unauthorized: 'unauthorized';
  forbidden: 'forbidden';
  recipientNotRegistered: 'recipient_not_registered';
  notFound: 'not_found';
  wrongInstance: 'wrong_instance';
  notAdaptivePlacement: 'not_adaptive_placement';
  historyChanged: 'history_changed';
  sessionExpired: 'session_expired';
  payloadTooLarge: 'payload_too_large';
  requestTimeout: 'request_timeout';
  tooManyRequests: 'too_many_requests';
  quotaExceeded: 'quota_exceeded';
  registryUnavailable: 'registry_unavailable';
  draining: 'draining';
  upgradeRequired: 'upgrade_required';
  internal: 'internal';
  badRequest: 'bad_request';
  headersTooLarge: 'headers_too_large';
  notImplemented: 'not_implemented';
  httpVersionNotSupported: 'http_version_not_supported';
  unexpectedResponse: 'unexpected_response';
}>;

/** The WebSocket close codes of the contract, by name (src/codes.js). */
export declare const closeCodes: Readonly<{
  unauthorized: 4401;
  replaced: 4409;
  sessionExpired: 4410;
  slowConsumer: 4429;
  restarting: 1012;
  policy: 1008;
  messageTooBig: 1009;
  invalidPayload: 1007;
}>;

/** Receives the client's diagnostics; console works. Missing methods discard. */
export interface Logger {
  debug?(msg: string, fields: object): void;
  info?(msg: string, fields: object): void;
  warn?(msg: string, fields: object): void;
  error?(msg: string, fields: object): void;
}

/** Which hub and session the client talks to, and what it calls back. */
export interface Config {
  /** Any hub instance or a load balancer, e.g. "http://127.0.0.1:8080". */
  hubURL?: string;
  /**
   * More hub instances (or balancers) to fail over to. The client starts with
   * hubURL (or, without it, the first of hubURLs) and moves to the next URL,
   * round the list, when the one in use gives no answer or answers 502, 503 or 504.
   */
  hubURLs?: string[];
  /** The project's API key. */
  apiKey: string;
  /**
   * One of Surface. Any string is accepted here so that a value the hub
   * refuses (400 invalid_surface) reaches it; Surface lists the valid ones.
   */
  surface: Surface | (string & {});
  /** Optional: empty lets the hub choose (read it back from client.sessionID). */
  sessionID?: string;
  /** One of RuntimeMode; any other string reaches the hub, which refuses it. */
  runtimeMode?: RuntimeMode | (string & {});
  /** Names the client build (the hub's adaptive placement allowlist). */
  clientID?: string;
  /**
   * Receives every signal addressed to the session: once per signal id, in
   * seq order, one at a time (a returned promise is awaited). The signal is
   * acknowledged after it settles; a throw is logged and counts as handled.
   * It may call send; it must not await close or deregister.
   */
  onSignal?: (signal: Signal) => void | Promise<void>;
  /**
   * Runtime-local state is gone: rehydrate it. Called, on the same loop as
   * onSignal and before any signal of the new attachment, when the hub's
   * welcome says affinity_reset, and after every re-registration of the
   * session (the hub had lost it).
   */
  onAffinityReset?: (info: AffinityReset) => void | Promise<void>;
  logger?: Logger;
  /** Backoff ceiling of the first redial of a dropped WebSocket. Default 250. */
  reconnectBaseDelayMs?: number;
  /** Cap of the backoff ceiling (full jitter: the wait is uniform below it). Default 15000. */
  reconnectMaxDelayMs?: number;
  /** Cap of the backoff ceiling instead while the hub restarts: from a close with 1012 until the next attach. Default 4000 (raised to the base, never above reconnectMaxDelayMs). */
  reconnectRestartMaxDelayMs?: number;
  /** Bound on each HTTP call to the hub. Default 30000. */
  requestTimeoutMs?: number;
  /** How many times one send, or one registration, is made when it gets no answer or a 502/503/504, always with the same idempotency key (a registration's is its own, sent as the Idempotency-Key header). Default 4; 1 never retries. */
  sendAttempts?: number;
  /**
   * How often the client pings the hub on its WebSocket, to find a path that
   * died silently (no FIN: a NAT or balancer that forgot it). Default 20000;
   * 0 disables the keepalive.
   */
  pingIntervalMs?: number;
  /**
   * A ping unanswered within it marks the connection dead: it is cut and
   * redialed with the backoff (stats().pingTimeouts). Default 10000.
   */
  pingTimeoutMs?: number;
  /**
   * Keeps the session token in this file (JSON, 0600, replaced atomically;
   * its directory made 0700), so that a restarted agent resumes its session
   * instead of being refused 403 as another holder of a live id, and with it
   * the session's tenant and project, which the resume names to the balancer
   * (x-marconi-project). Not with tokenStore.
   */
  tokenFile?: string;
  /**
   * Keeps the session token where the application says: dial loads it, and
   * every new token (registration, resume, re-registration, takeover) is
   * saved. Not with tokenFile.
   */
  tokenStore?: TokenStore;
  /**
   * A registration refused 403 because the id is live (its token lost) is
   * made again with "takeover": true: the hub gives a new token, the former
   * holder's stops working (its WebSocket closes 4409), pending signals
   * stay, and onAffinityReset is called with reason "taken_over". Default false.
   */
  takeover?: boolean;
  /**
   * Called once when the client stops for good while running (the hub
   * refused the session while reconnecting: a MarconiError such as 401
   * unauthorized; or a newer connection replaced this one: ReplacedError,
   * code "replaced"), before the 'fatal' event. From then on it neither
   * reconnects nor heartbeats: close it. Not called for dial's own failure
   * (dial rejects) nor at close.
   */
  onFatal?: (err: MarconiError | ReplacedError) => void;
  /**
   * How long one registration or send waits in all for 429 answers: each is
   * waited out for its Retry-After (plus up to a quarter of jitter), or the
   * reconnect backoff when the header is missing or unreadable, and the call
   * made again; a Retry-After beyond what is left, and a quota_exceeded
   * without one (waiting does not help), are returned at once.
   * Default 60000; 0 never waits.
   */
  rateLimitWaitMs?: number;
  /**
   * true turns off sending to the recipient's instance. By default, when a
   * send's answer names the instance holding the recipient's queue
   * (recipient_instance_url), the client sends that recipient's next signals
   * there, with the same session token, and goes back to the hub URL when an
   * answer names none. Only a send that certainly did not reach that
   * instance (the connection could not be made, or a balancer answered 502
   * or 503 itself) is sent through the hub URL at once (docs/client.md,
   * "Sending to the recipient's instance (Node)"). Default false.
   */
  noHolderRouting?: boolean;
  /**
   * How many recipients' instance URLs the client remembers (and how many
   * unreachable ones it leaves alone). Default 1024.
   */
  holderHints?: number;
  /**
   * How long an instance URL that could not be reached is not sent to: its
   * recipients' sends go through the hub URL, without a dial each.
   * Default 30000.
   */
  holderRetryAfterMs?: number;
  /**
   * The least time between two acknowledgements the client sends: the
   * signals handled meanwhile are acknowledged together once it has passed,
   * so that a recipient handed signals one at a time, faster than the hub
   * lets a connection send frames (MARCONI_WS_FRAMES_PER_SECOND, default
   * 100, pings included), is not cut off for acknowledging each. After a
   * quiet spell a signal is acknowledged at once. Default 500.
   */
  ackIntervalMs?: number;
}

/**
 * A session's id and current token, as a TokenStore keeps them, with the
 * session's tenant and project: a restarted agent names them
 * (x-marconi-project) from its first request, so that a balancer hashing on
 * the project sends its resume and attach to the project's instance. A token
 * without them (an older client's file, a store that drops them) still
 * resumes; the header then waits for the hub's answer.
 */
export interface SessionToken {
  sessionID: string;
  token: string;
  tenantID?: string;
  projectID?: string;
  /**
   * Set by a load that dropped the kept tenant and project, unreadable
   * (fileTokenStore: 'tenant_id' or 'project_id', not a JSON string): dial
   * logs it at warn level and resumes with the token, naming the project
   * from the hub's answer on. Never saved.
   */
  dropped?: string;
}

/** Keeps the session token across restarts of the agent. */
export interface TokenStore {
  /** The kept token, or null when nothing is kept; a rejection fails dial. */
  load(): Promise<SessionToken | null>;
  /** Replaces the kept token; a rejection at dial fails dial, later it is logged. */
  save(token: SessionToken): Promise<void>;
}

/** A TokenStore in a JSON file (0600, replaced atomically; its directory made 0700). */
export declare function fileTokenStore(file: string): TokenStore;

/** Why onAffinityReset was called. */
export interface AffinityReset {
  /** "affinity_reset": the hub's welcome said so; "reregistered": the hub had lost the session and it was registered again. */
  reason: 'affinity_reset' | 'reregistered' | 'taken_over';
  /** Pending signals the hub discarded at the reset (disconnect policy drop); 0 otherwise. */
  dropped: number;
}

/** One signal addressed to this session, as the hub delivers it. */
export interface Signal {
  id: string;
  seq: number;
  fromSession: string;
  toSession: string;
  kind: string;
  payload: unknown;
  createdAt: Date;
}

/** The hub's answer to a send. The client has already acted on senderRouteStale when send resolves. */
export interface SendResult {
  signalID: string;
  seq: number;
  delivery: Delivery;
  recipientRouteState: RouteState;
  /** SPEC-168 outcome, null when the hub sent null. */
  selfhealOutcome: SelfhealOutcome | null;
  recipientRouteStale: boolean;
  senderRouteStale: boolean;
  /** The hub had stored this idempotency key already: this is the first send's answer. */
  duplicate: boolean;
  /** The key the send carried (the caller's, or one generated for this call). */
  idempotencyKey: string;
}

export interface SendOptions {
  /** Reuse to make a repeat of this send a no-op on the hub (24 h); default: a new UUID per call, reused by the client's own retries. */
  idempotencyKey?: string;
  /** Cancels the send (and its retries). */
  signal?: AbortSignal;
}

/** What the client did to keep its route. */
export interface Stats {
  /** Successful reattachments after the first, whatever the cause. */
  reconnects: number;
  /** Reconnects started by a send answered with sender_route_stale. */
  selfHealReconnects: number;
  /** Times the session had to be registered again because the hub no longer knew it. */
  reregistrations: number;
  /** Sum of the welcomes' "dropped" (disconnect policy drop). */
  droppedAtReset: number;
  /** Sends made again after no answer or a 502/503/504. */
  sendRetries: number;
  /** Moves to the next hub URL after one gave no answer. */
  failovers: number;
  /** Connections cut because the hub left a ping unanswered (a path that died silently). */
  pingTimeouts: number;
  /** Registrations the hub answered taken_over (config takeover). */
  takeovers: number;
  /** 429 answers waited out and the call made again (rateLimitWaitMs), attaches included. */
  rateLimited: number;
  /** Sends answered by the instance holding the recipient's queue, sent there on the hub's hint. */
  holderSends: number;
  /** Sends made through the hub URL instead because that instance could not be reached (holderRetryAfterMs). */
  holderFallbacks: number;
  /**
   * Acknowledgements the client sent that reached the hub: ack frames written,
   * and POST /v1/signals/ack answered while the WebSocket was down. Paced by
   * ackIntervalMs, each covers every signal handled before it. As Go's Stats().Acks.
   */
  acks: number;
}

/** Defaults of the optional numeric Config fields. */
export declare const defaults: Readonly<{
  reconnectBaseDelayMs: number;
  reconnectMaxDelayMs: number;
  reconnectRestartMaxDelayMs: number;
  requestTimeoutMs: number;
  sendAttempts: number;
  pingIntervalMs: number;
  pingTimeoutMs: number;
  rateLimitWaitMs: number;
  holderHints: number;
  holderRetryAfterMs: number;
  ackIntervalMs: number;
}>;

/**
 * Registers the session (or the one named by config.sessionID), attaches its
 * WebSocket and starts the heartbeat, read and delivery loops. Resolves once
 * the hub has welcomed the connection.
 */
export declare function dial(config: Config, options?: { signal?: AbortSignal }): Promise<Client>;

/**
 * One registered, attached session. Emits 'fatal' once when it stops for
 * good (as onFatal); never 'error', which would throw without a listener.
 */
export declare class Client extends EventEmitter {
  on(event: 'fatal', listener: (err: MarconiError | ReplacedError) => void): this;
  once(event: 'fatal', listener: (err: MarconiError | ReplacedError) => void): this;
  private constructor(config: Config);
  /** The session's id, as the hub registered it. */
  readonly sessionID: string;
  /** Sends a signal; payload is encoded as JSON. Rejects with MarconiError when the hub refused. */
  send(to: string, kind: string, payload: unknown, options?: SendOptions): Promise<SendResult>;
  stats(): Stats;
  /** Closes the WebSocket (1000) and stops every loop; the session stays registered until its TTL. Idempotent. */
  close(): Promise<void>;
  /**
   * Ends the session on the hub (DELETE /v1/session), then closes the client.
   * On an error other than session_expired the client keeps running.
   */
  deregister(options?: { signal?: AbortSignal }): Promise<void>;
}

/** An error answered by the hub, with its stable code (docs/api.md). */
export declare class MarconiError extends Error {
  readonly status: number;
  readonly code: ErrorCode;
  /** The hub's human readable message. */
  readonly hubMessage: string;
  /** On 409 wrong_instance: where the session's queue lives. */
  readonly instanceURL: string | undefined;
  /** The Retry-After header in seconds, when the hub sent one (429, 503). */
  readonly retryAfterSeconds: number | undefined;
}

/** The hub could not be reached or gave no answer (connection refused, reset, timeout). */
export declare class TransportError extends Error {}

/** A newer connection of the session replaced the client's (close 4409). */
export declare class ReplacedError extends Error {
  readonly code: 'replaced';
}

/** A call on a client that was closed or deregistered. */
export declare class ClientClosedError extends Error {}
