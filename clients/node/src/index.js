// Marconi's Node client: the same contract as the Go client (bootstrap-client).
// See docs/client.md in the repository.

export { Client, dial, defaults } from './client.js';
export { ClientClosedError, MarconiError, ReplacedError } from './errors.js';
export { fileTokenStore } from './tokens.js';
export { codes, closeCodes } from './codes.js';
export { TransportError } from './http.js';
