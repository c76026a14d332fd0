// index.d.ts: the types of index.js.  One line per lib module.
export { Guard, defaultStore, parseKey } from './lib/core';
export type { GuardOptions, IdempotencyInfo, Outcome, Answer, StoredResponse, ParsedKey, GuardState, StartResult } from './lib/core';
export * from './lib/express';
export * from './lib/fastify';
export * from './lib/phases';
