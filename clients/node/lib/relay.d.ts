// Type declarations of lib/relay.js: outbox relays and the webhook deliverer.
import type { Pool } from 'pg';

/** One claimed outbox message, as the handler receives it. */
export interface OutboxMessage {
	/** the message's row id (bigint as a string); ack/nack name it */
	id: string;
	/** stable message id: send it downstream as Idempotency-Key */
	messageId: string;
	topic: string;
	/** message_key given to publish(), or null */
	key: string | null;
	payload: unknown;
	headers: Record<string, string>;
	/** 1 on the first delivery, then 2, 3, ... */
	attempt: number;
	publishedAt: Date;
	/** the claim's token (idempotency.ack(claim, ids)) */
	claim: string;
}

/** What a handler may throw to steer the retry. */
export interface RelayError extends Error {
	/** milliseconds until the message is retried (default: the topic's backoff) */
	retryInMs?: number;
	/** @deprecated retryInMs's 0.5.0 name (milliseconds too) */
	retryIn?: number;
	/** HTTP status of a failed webhook */
	status?: number;
}

export interface RelayOptions {
	/** node-postgres pool; one of its clients is held for idempotency.wait_for() */
	pool: Pool;
	/** messages per claim (default 10) */
	batchSize?: number;
	/** handlers running at once (default 10) */
	concurrency?: number;
	/** milliseconds a claim keeps a message from other relays (default 30000) */
	visibilityMs?: number;
	/** the longest milliseconds a wait for a commit lasts before the relay claims again (default 5000) */
	pollIntervalMs?: number;
	/** milliseconds to wait after a database error (default 1000) */
	retryDelayMs?: number;
	/** @deprecated visibilityMs's 0.5.0 name (milliseconds too) */
	visibility?: number;
	/** @deprecated pollIntervalMs's 0.5.0 name (milliseconds too) */
	pollInterval?: number;
	/** @deprecated retryDelayMs's 0.5.0 name (milliseconds too) */
	retryDelay?: number;
	/** stop gracefully on SIGTERM and SIGINT (default true) */
	handleSignals?: boolean;
	/** database and ack errors (default: console.error) */
	onError?: (err: Error) => void;
}

export interface RelayCounts {
	claimed: number;
	acked: number;
	nacked: number;
	released: number;
	errors: number;
}

export declare class Relay {
	readonly topic: string;
	readonly counts: RelayCounts;
	/** resolves when the relay has stopped */
	readonly done: Promise<void>;
	/** stop claiming, finish the handlers in hand, release the rest */
	stop(): Promise<void>;
}

/** Deliver the messages of topic to handler: resolve = ack, throw = nack. */
export declare function relay(
	topic: string,
	handler: (message: OutboxMessage) => unknown | Promise<unknown>,
	options: RelayOptions,
): Relay;

export interface WebhookOptions {
	/** milliseconds to wait for an answer (default 10000) */
	timeoutMs?: number;
	/** @deprecated timeoutMs's 0.5.0 name (milliseconds too) */
	timeout?: number;
	/** headers added to every request */
	headers?: Record<string, string>;
}

/** A handler that POSTs the payload as JSON with Idempotency-Key: <messageId>; non-2xx throws. */
export declare function webhook(
	url: string | ((message: OutboxMessage) => string),
	options?: WebhookOptions,
): (message: OutboxMessage) => Promise<{ status: number; body: string }>;
