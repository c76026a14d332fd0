// core.d.ts: types of lib/core.js (what the Express and Fastify
// integrations share).  Only node-postgres types are needed here.
import type { Pool, PoolClient } from 'pg';

/** A response as the middleware sends it and stores it. */
export interface Answer {
	status: number;
	headers: Record<string, string>;
	body: Buffer;
}

/** The stored response (jsonb), the byte-exact replay convention. */
export interface StoredResponse {
	status: number;
	headers: Record<string, string>;
	/** the body when it is valid UTF-8 without NUL */
	body?: string;
	/** otherwise the body, base64 */
	body_base64?: string;
}

/** What parseKey() makes of an Idempotency-Key header. */
export type ParsedKey =
	| { key: string; missing?: undefined; error?: undefined }
	| { missing: true; key?: undefined; error?: undefined }
	| { error: string; key?: undefined; missing?: undefined };

/** begin()'s outcome for a request the handler runs: first attempt or retry. */
export type Outcome = 'new' | 'retry';

/**
 * Options of idempotent() and idempotentFastify() (and new Guard()).
 * Req is the framework's request object.
 */
export interface GuardOptions<Req = any> {
	/** The pool the guarded transaction takes its client from (required). */
	pool: Pool;
	/** The key scope, or a function of the request (required). */
	scope: string | ((req: Req) => string);
	/** The authenticated user: appended to the scope as "|user:<id>". Default: none. */
	user?: (req: Req) => string | number | null | undefined;
	/** idempotency.lock_wait for begin(), in milliseconds. Default 200. */
	lockWaitMs?: number;
	/** @deprecated lockWaitMs's 0.5.0 name (milliseconds too). */
	lockWait?: number;
	/** How often 40001/40P01 from begin() is retried. Default 3. */
	retries?: number;
	/** Whether a request without a key is refused (400). Default true; false runs it unguarded. */
	required?: boolean;
	/** Response headers stored and replayed besides Content-Type and Location. */
	headers?: string[];
	/** The key's time to live, in milliseconds. Default the server's idempotency.default_ttl. */
	ttlMs?: number | null;
	/** @deprecated use ttlMs: the 0.5.0 form, interval text ('24 hours'). */
	ttl?: string | null;
	/** The value fingerprinted for the key. Default {method, path, body}. */
	request?: (req: Req) => unknown;
	/** Whether an answer is stored. Default defaultStore (not 408, 409, 425, 429 nor 5xx). */
	store?: (status: number) => boolean;
}

/** The guarded transaction a handler runs in. */
export interface GuardState {
	client: PoolClient;
	key: string;
	scope: string;
	outcome: Outcome;
	attempts: number;
	done: boolean;
}

/** What the middleware puts in req.idempotency for the handler. */
export interface IdempotencyInfo {
	/** the guarded transaction's client (also req.db) */
	client: PoolClient;
	key: string;
	scope: string;
	outcome: Outcome;
	/** how many times this key's handler has begun (1 on the first) */
	attempts: number;
}

export type StartResult =
	| { send: Answer; replayed?: boolean; state?: undefined }
	| { state: GuardState; send?: undefined; replayed?: undefined };

/** The request cycle both integrations drive. */
export class Guard<Req = any> {
	constructor(opts: GuardOptions<Req>);
	readonly pool: Pool;
	readonly lockWait: number;
	readonly retries: number;
	readonly required: boolean;
	/** The time to live as sent to begin(): interval text, or null. */
	readonly ttl: string | null;
	readonly headerNames: string[];
	store: (status: number) => boolean;
	scopeFor(req: Req): string;
	requestFor(req: Req, method: string, path: string, body: unknown): unknown;
	start(key: string, scope: string, request: unknown): Promise<StartResult>;
	finish(state: GuardState, status: number, getHeader: (name: string) => unknown, body: Buffer): Promise<Answer | null>;
	abort(state: GuardState): Promise<void>;
}

/** The default store rule: false for 408, 409, 425, 429 and every 5xx. */
export function defaultStore(status: number): boolean;
/** The Idempotency-Key header (structured-field string or bare). */
export function parseKey(value: string | string[] | null | undefined): ParsedKey;
/** An application/problem+json answer. */
export function problem(status: number, title: string, detail: string, headers?: Record<string, string>): Answer;
export function toBuffer(body: unknown): Buffer;
export function encodeResponse(status: number, getHeader: (name: string) => unknown, body: Buffer, names: string[]): StoredResponse;
export function decodeResponse(stored: unknown, status?: string): Answer;

/**
 * A duration option in milliseconds under its unit-carrying name (e.g. lockWaitMs) or its
 * deprecated 0.5.0 name (old; null: none): the value, or null when neither is given.
 * Both at once, or a value that is not a number >= 0, is a TypeError naming `who`.
 */
export function msOption(opts: Record<string, unknown>, name: string, old: string | null, who: string): number | null;
