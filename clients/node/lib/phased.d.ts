// phased.d.ts: types of lib/phased.js, what idempotentPhases (Express) and
// idempotentPhasesFastify share.  Only node-postgres types: no framework.
import type { Pool } from 'pg';
import type { Answer } from './core';
import type { Json, PhaseContext, PhaseState } from './phases';

/** What a phased endpoint answers: response() returns it, a permanent PhaseError carries its status and body. */
export interface HttpAnswer {
	/** The HTTP status; stored and replayed when store(status) (default: not 408, 409, 425, 429 nor 5xx). */
	status: number;
	/** A JSON value (sent as JSON, Content-Type application/json), a string (text/plain) or bytes (application/octet-stream). */
	body?: Json | string | Buffer | Uint8Array;
	/** Response headers (stored and replayed); a Content-Type here wins. */
	headers?: Record<string, string | number>;
}

/** runPhases()'s context, plus the framework's request. */
export interface HttpPhaseContext<Req = any> extends PhaseContext {
	/** The framework's request (Express req, Fastify request). */
	req: Req;
}

export interface HttpPhase<Req = any> {
	name: string;
	/** The phase's work; its result is stored as state[name] (JSON). */
	run(ctx: HttpPhaseContext<Req>): Promise<Json | void> | Json | void;
	/** Run outside a transaction (a call to another system; ctx.client is null); default false. */
	external?: boolean;
}

/** Options of idempotentPhases() and idempotentPhasesFastify(). Req is the framework's request. */
export interface PhasedOptions<Req = any> {
	/** The pool the phases take their clients from (required). */
	pool: Pool;
	/** The key scope, or a function of the request (required). */
	scope: string | ((req: Req) => string);
	/** The authenticated user: appended to the scope as "|user:<id>". Default: none. */
	user?: (req: Req) => string | number | null | undefined;
	/** The value fingerprinted for the key. Default {method, path, body}. */
	request?: (req: Req) => unknown;
	/** Whether response()'s answer is stored. Default defaultStore (not 408, 409, 425, 429 nor 5xx). */
	store?: (status: number) => boolean;
	/** The phases, run in order (names unique). */
	phases: HttpPhase<Req>[];
	/** The answer, from the final state (every phase's result under its name). */
	response(state: PhaseState, req: Req): HttpAnswer;
	/** Milliseconds an attempt holds the key between renewals (a crashed attempt is taken over after it). Default 30000. */
	leaseMs?: number;
	/** Milliseconds between lease renewals. Default leaseMs / 3. */
	renewEveryMs?: number;
	/** Milliseconds the key lives. Default the server's idempotency.default_ttl. */
	ttlMs?: number | null;
}

/** One phased endpoint, framework-free: handle() answers one request. */
export class PhasedEndpoint<Req = any> {
	constructor(opts: PhasedOptions<Req>, who?: string);
	handle(req: Req, keyHeader: string | string[] | undefined, method: string, path: string,
		body: unknown): Promise<Answer & { replayed?: boolean }>;
}

/** response()'s answer as sent: the body serialized, Content-Type defaulted. */
export function toAnswer(answer: HttpAnswer, who: string): Answer;
