'use strict';
// relay.js: relay(topic, handler, options) delivers the messages of an
// outbox topic (idempotency.publish()) to handler, and webhook(url, options)
// is a handler that POSTs each message with Idempotency-Key: <message id>.
//
// The relay claims up to batchSize messages with a visibility timeout (visibilityMs)
// (idempotency.claim), runs handler on at most
// concurrency of them at a time, and acks each one whose handler resolved
// (idempotency.ack) or nacks it with the error when it threw
// (idempotency.nack: retried later with backoff, dead after the topic's
// max_attempts).  It claims again at once while claims return messages; when
// one returns none it blocks in idempotency.wait_for() on a connection of its
// own until a transaction that published to the topic commits (woken through
// the server's shared memory: no LISTEN/NOTIFY, works through PgBouncer in
// transaction mode), or pollIntervalMs passes (retries and deliver_after times
// that come due).  It passes back the cursor wait_for() returned, read before
// its claim, so a commit between an empty claim and the wait is not missed.
// Where the server lacks the preloaded library (wait_for() raises 55000),
// it polls every pollIntervalMs instead.  A key's messages arrive one at a
// time in commit order (the server hands out the next one only after the
// earlier one's ack).
//
// Delivery is at least once: a relay that dies before its ack loses nothing
// (the claim lapses after visibilityMs and the message is claimed again), so
// the receiver must be idempotent: use message.messageId as its key.
//
// stop() (and SIGTERM/SIGINT unless handleSignals is false) stops claiming,
// waits for the handlers in hand, and releases the claimed messages it has
// not started (idempotency.release: claimable again at once, the attempt not
// counted); a wait in progress is cancelled, so stop() returns as soon as the
// handlers in hand settle.  Database errors (a restart, a failover) are
// reported to onError and retried after retryDelayMs.  (Durations are
// milliseconds, in names that end in Ms; visibility, pollInterval,
// retryDelay, and webhook's timeout are their deprecated 0.5.0 names.)

const net = require('net');
const { checkExtension } = require('./compat');

const { msOption } = require('./core');

const DEFAULTS = {
	batchSize: 10,
	concurrency: 10,
	visibilityMs: 30000,	// a claim keeps a message from other relays
	pollIntervalMs: 5000,	// a wait lasts at most (retries that come due)
	retryDelayMs: 1000,		// after a database error
	handleSignals: true,
};
// the duration options' 0.5.0 names (milliseconds too), deprecated
const RENAMED = [['visibilityMs', 'visibility'], ['pollIntervalMs', 'pollInterval'], ['retryDelayMs', 'retryDelay']];

const CLAIM_SQL = 'SELECT id, message_id, topic, message_key, payload, headers, attempt, published_at, claim' +
	' FROM idempotency.claim($1, $2, make_interval(secs => $3::float8 / 1000))';
const ACK_SQL = 'SELECT idempotency.ack($1, $2::int8[]) AS n';
const NACK_SQL = 'SELECT idempotency.nack($1, $2::int8[], $3::jsonb,' +
	' CASE WHEN $4::float8 IS NULL THEN NULL ELSE make_interval(secs => $4::float8 / 1000) END) AS n';
const RELEASE_SQL = 'SELECT idempotency.release($1, $2::int8[]) AS n';
const WAIT_SQL = 'SELECT cursor FROM idempotency.wait_for(ARRAY[$1::text],' +
	' make_interval(secs => $2::float8 / 1000), $3::int8[])';
const TOPIC_RE = /^[A-Za-z0-9_.:-]{1,40}$/;

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

function toMessage(row) {
	return {
		id: String(row.id),
		messageId: row.message_id,
		topic: row.topic,
		key: row.message_key,
		payload: row.payload,
		headers: row.headers || {},
		attempt: row.attempt,
		publishedAt: row.published_at,
		claim: row.claim,
	};
}

function errorJson(err) {
	const out = { error: String((err && err.message) || err) };
	if (err && err.status !== undefined) out.status = err.status;
	return out;
}

class Relay {
	constructor(topic, handler, options) {
		if (typeof topic !== 'string' || !TOPIC_RE.test(topic))
			throw new TypeError('relay: topic must be 1 to 40 of A-Z a-z 0-9 _ . : -');
		if (typeof handler !== 'function') throw new TypeError('relay: handler must be a function');
		if (!options || !options.pool) throw new TypeError('relay: options.pool (a pg.Pool) is required');
		this.topic = topic;
		this.handler = handler;
		this.opts = { ...DEFAULTS, ...options };
		for (const [name, old] of RENAMED) {
			this.opts[name] = msOption(options, name, old, 'relay') ?? DEFAULTS[name];
			delete this.opts[old];
		}
		for (const n of ['batchSize', 'concurrency', 'visibilityMs', 'pollIntervalMs', 'retryDelayMs'])
			if (!(Number(this.opts[n]) > 0)) throw new TypeError(`relay: ${n} must be a positive number`);
		this.pool = this.opts.pool;
		this.onError = this.opts.onError || (err => console.error(`relay ${topic}:`, err.message));
		this.stopping = false;
		this.queue = [];			// claimed, not started
		this.running = 0;			// handlers in hand
		this.counts = { claimed: 0, acked: 0, nacked: 0, released: 0, errors: 0 };
		this.waiter = null;			// the connection wait_for() blocks on
		this.waiting = null;		// its query while it waits
		this.cursor = null;			// wait_for()'s cursor (strings: int8)
		this.polling = false;		// no wait_for() on this server: poll
		this.wake = null;
		this.slot = null;
		this.signals = [];
		if (this.opts.handleSignals)
			for (const sig of ['SIGTERM', 'SIGINT']) {
				const fn = () => { this.stop(); };
				process.once(sig, fn);
				this.signals.push([sig, fn]);
			}
		this.done = this.run();
	}

	// wait for a notification, a stop, or ms
	waitForWork(ms) {
		return new Promise(resolve => {
			const t = setTimeout(finish, ms);
			const self = this;
			function finish() { clearTimeout(t); if (self.wake === finish) self.wake = null; resolve(); }
			this.wake = finish;
		});
	}

	poke() { if (this.wake) this.wake(); }

	// the connection wait_for() blocks on, kept while the relay runs
	async waiterClient() {
		if (this.waiter) return this.waiter;
		const client = await this.pool.connect();
		const drop = err => {
			if (this.waiter !== client) return;
			this.waiter = null;
			this.cursor = null;
			client.release(err || true);
		};
		client.on('error', drop);
		this.waiter = client;
		this.dropWaiter = drop;
		return client;
	}

	// wait_for(topic, ms, cursor) -> the next cursor; the cursor alone
	// (ms 0) when there is none yet.  55000 (no preloaded library): poll.
	async waitFor(ms) {
		const client = await this.waiterClient();
		const q = client.query(WAIT_SQL, [this.topic, ms, this.cursor]);
		this.waiting = client;
		try {
			const { rows } = await q;
			this.cursor = rows[0].cursor;
		} catch (err) {
			if (err && err.code === '55000') {
				this.polling = true;
				this.report(err);
				return;
			}
			if (!this.stopping) this.dropWaiter(err);
			if (this.stopping && err && err.code === '57014') return;
			throw err;
		} finally {
			this.waiting = null;
		}
	}

	// cancel a wait in progress (stop()): the protocol's CancelRequest on a
	// connection of its own, as libpq's PQcancel sends it (PgBouncer
	// forwards it too); a cancel that arrives between statements is ignored
	// by the server, and the wait then ends at its timeout
	cancelWait() {
		const client = this.waiting;
		if (!client || !client.processID) return;
		const msg = Buffer.alloc(16);
		msg.writeInt32BE(16, 0);
		msg.writeInt32BE(80877102, 4);
		msg.writeInt32BE(client.processID, 8);
		msg.writeInt32BE(client.secretKey, 12);
		const host = client.host || 'localhost';
		const sock = host.startsWith('/') ?
			net.connect(`${host}/.s.PGSQL.${client.port}`) : net.connect(client.port, host);
		// as libpq does: write, then wait for the server to close (PgBouncer
		// 1.18 crashed on a cancel connection half-closed at once)
		sock.on('error', () => {});
		sock.on('connect', () => sock.write(msg));
		sock.on('end', () => sock.end());
		sock.setTimeout(5000, () => sock.destroy());
		sock.unref();
	}

	report(err) {
		this.counts.errors++;
		try { this.onError(err); } catch (e) { /* the callback's own problem */ }
	}

	async run() {
		const o = this.opts;
		while (!this.stopping) {
			try {
				await checkExtension(this.pool);	// a query on the pool's first use only
				if (!this.polling && this.cursor === null) await this.waitFor(0);
				const free = o.concurrency - this.running - this.queue.length;
				if (free <= 0) {
					await new Promise(resolve => { this.slot = resolve; });
					continue;
				}
				const { rows } = await this.pool.query(CLAIM_SQL,
					[this.topic, Math.min(o.batchSize, free), o.visibilityMs]);
				this.counts.claimed += rows.length;
				for (const row of rows) this.queue.push(toMessage(row));
				this.drain();
				if (rows.length === 0 && !this.stopping) {
					if (this.polling) await this.waitForWork(o.pollIntervalMs);
					else await this.waitFor(o.pollIntervalMs);
				}
			} catch (err) {
				if (this.stopping) break;
				this.report(err);
				await this.waitForWork(o.retryDelayMs);
			}
		}
		await this.shutdown();
	}

	drain() {
		while (this.queue.length > 0 && this.running < this.opts.concurrency && !this.stopping)
			this.deliver(this.queue.shift());
	}

	async deliver(msg) {
		this.running++;
		try {
			let failure = null;
			try {
				await this.handler(msg);
			} catch (err) {
				failure = err || new Error('handler failed');
			}
			await this.settle(msg, failure);
		} finally {
			this.running--;
			if (this.slot) { const s = this.slot; this.slot = null; s(); }
			if (this.idle && this.running === 0) this.idle();
			this.drain();
		}
	}

	// ack or nack one message; a database error is retried until stop, since
	// an unacked message is delivered again anyway (at least once)
	async settle(msg, failure) {
		for (let tries = 0; ; tries++) {
			try {
				if (failure === null) {
					await this.pool.query(ACK_SQL, [msg.claim, [msg.id]]);
					this.counts.acked++;
				} else {
					// retryInMs (retryIn: its deprecated 0.5.0 name), milliseconds
					const ri = failure && (failure.retryInMs ?? failure.retryIn);
					const retryIn = Number.isFinite(ri) ? ri : null;
					await this.pool.query(NACK_SQL, [msg.claim, [msg.id], JSON.stringify(errorJson(failure)), retryIn]);
					this.counts.nacked++;
				}
				return;
			} catch (err) {
				this.report(err);
				if (this.stopping || tries >= 5) return;	// the claim will lapse
				await sleep(this.opts.retryDelayMs);
			}
		}
	}

	async shutdown() {
		// claimed but not started: give them back
		const rest = this.queue.splice(0);
		const byClaim = new Map();
		for (const m of rest) {
			if (!byClaim.has(m.claim)) byClaim.set(m.claim, []);
			byClaim.get(m.claim).push(m.id);
		}
		for (const [claim, ids] of byClaim) {
			try {
				const r = await this.pool.query(RELEASE_SQL, [claim, ids]);
				this.counts.released += Number(r.rows[0].n);
			} catch (err) {
				this.report(err);	// the claims lapse after visibility
			}
		}
		if (this.running > 0) await new Promise(resolve => { this.idle = resolve; });
		if (this.waiter) {
			const w = this.waiter;
			this.waiter = null;
			w.removeListener('error', this.dropWaiter);
			// closed, not pooled: an idle client would keep the pool's
			// timer (idleTimeoutMillis) and so the process alive after stop
			w.release(true);
		}
		for (const [sig, fn] of this.signals) process.removeListener(sig, fn);
	}

	// stop claiming, finish what is in hand, release the rest; resolves when done
	stop() {
		this.stopping = true;
		this.poke();
		this.cancelWait();
		if (this.slot) { const s = this.slot; this.slot = null; s(); }
		return this.done;
	}
}

// relay(topic, handler, options) -> Relay (relay.done resolves after stop())
function relay(topic, handler, options) {
	return new Relay(topic, handler, options);
}

// webhook(url, options) -> handler POSTing the payload as JSON with
// Idempotency-Key: <message id>, the message's headers and options.headers.
// A 2xx answer is success; anything else (or a network error, or no answer
// within timeoutMs) throws, so the relay nacks and the message is retried;
// a Retry-After answer sets when (retryInMs).  (timeout: timeoutMs's
// deprecated 0.5.0 name, milliseconds too.)
function webhook(url, options = {}) {
	const timeout = msOption(options, 'timeoutMs', 'timeout', 'webhook') ?? 10000;
	const extra = options.headers || {};
	return async function deliverWebhook(msg) {
		const headers = {
			'content-type': 'application/json',
			...msg.headers,
			...extra,
			'idempotency-key': msg.messageId,
		};
		let res;
		try {
			res = await fetch(typeof url === 'function' ? url(msg) : url, {
				method: 'POST', headers, body: JSON.stringify(msg.payload),
				signal: AbortSignal.timeout(timeout),
			});
		} catch (err) {
			throw new Error(`webhook: ${err.name === 'TimeoutError' ? `no answer in ${timeout} ms` : err.message}`);
		}
		const text = await res.text().catch(() => '');
		if (res.status >= 200 && res.status < 300) return { status: res.status, body: text };
		const err = new Error(`webhook: HTTP ${res.status}`);
		err.status = res.status;
		err.body = text.slice(0, 1000);
		const ra = Number(res.headers.get('retry-after'));
		if (Number.isFinite(ra) && ra >= 0) err.retryInMs = err.retryIn = ra * 1000;
		throw err;
	};
}

module.exports = { relay, webhook, Relay };
