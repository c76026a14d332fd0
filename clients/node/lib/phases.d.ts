// Type declarations for lib/phases.js: named phases under one idempotency
// key in lease mode, resumable after a crash (idempotency.checkpoint()).
import type { Pool, PoolClient } from 'pg';

/** JSON a phase may return and the key's recovery_state holds. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** The results of the phases so far, each under its phase's name. */
export type PhaseState = { [phase: string]: Json };

export interface PhaseContext {
	/** A client inside the phase's transaction; null for an external phase. */
	client: PoolClient | null;
	/** Results of the phases before this one (restored on a retry). */
	state: PhaseState;
	/** The request given to runPhases(). */
	request: Json;
	key: string;
	scope: string;
	/** The attempt holding the lease (begin()'s attempts). */
	attempt: number;
	/** begin()'s outcome for this run: 'new' or 'retry'. */
	outcome: 'new' | 'retry';
	/** idempotency.derive_key(key, step, scope): the same on every attempt. */
	deriveKey(step: string): Promise<string>;
	/** Aborted when the key was taken over by another attempt. */
	signal: AbortSignal;
}

export interface Phase {
	name: string;
	/** The phase's work; its result is stored as state[name]. */
	run(ctx: PhaseContext): Promise<Json | void> | Json | void;
	/** Run outside a transaction (a call to another system); default false. */
	external?: boolean;
}

export interface RunPhasesOptions {
	key: string;
	scope?: string;
	/** Fingerprinted: the same key with another request is IK001. */
	request?: Json;
	/** Milliseconds an attempt holds the key between renewals; default 30000. */
	leaseMs?: number;
	/** Milliseconds between renewals; default leaseMs / 3. */
	renewEveryMs?: number;
	/** Milliseconds the key lives; default idempotency.default_ttl. */
	ttlMs?: number | null;
	/** @deprecated leaseMs's 0.5.0 name (milliseconds too). */
	lease?: number;
	/** @deprecated renewEveryMs's 0.5.0 name (milliseconds too). */
	renewEvery?: number;
	/** @deprecated ttlMs's 0.5.0 name (milliseconds too). */
	ttl?: number | null;
	phases: Phase[];
	/** The response complete() stores, from the final state. */
	response(state: PhaseState): Json;
	/** What fail() stores for a phase that threw; default {error: err.message}. */
	failure?(err: unknown, permanent: boolean): Json;
	hooks?: {
		/** After each commit: '(begin)', a phase's name, '(complete)'. */
		afterCommit?(name: string): Promise<void> | void;
	};
}

export interface RunPhasesResult {
	outcome: 'new' | 'retry' | 'replay';
	/** For a replay, 'completed' or 'failed'. */
	status?: 'completed' | 'failed';
	response: Json;
	attempts: number;
	/** The recovery point this run started after (null: from the start). */
	resumedFrom: string | null;
}

export class PhaseError extends Error {
	constructor(message: string, options?: {
		permanent?: boolean; cause?: unknown;
		/** The HTTP status idempotentPhases stores for a permanent error; default 400. */
		status?: number;
		/** Its body (JSON); default {"error": message}. */
		body?: Json;
	});
	/** true: fail(retryable => false), the failure is replayed from then on. */
	permanent: boolean;
	status?: number;
	body?: Json;
}

export function runPhases(pool: Pool, opts: RunPhasesOptions): Promise<RunPhasesResult>;
