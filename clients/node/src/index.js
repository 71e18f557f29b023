// Marconi's Node client: the same contract as the Go client (bootstrap-client).
// See docs/client.md in the repository.

export { Client, dial, defaults } from './client.js';
export { ClientClosedError, MarconiError } from './errors.js';
export { codes, closeCodes } from './codes.js';
export { TransportError } from './http.js';
