#!/usr/bin/env bash
# portable/relay_smoke.sh — the Node relay (clients/node relay()) against the
# portable edition installed by psql -f (no extension): 100 keyed messages
# delivered, then 100 more published while the relay waits in wait_for()
# (poll interval 5 s, so a wake-up, not its timeout, delivers them within
# it); every message acked once, in order per key, no error, no fallback
# to polling.  By hand, not in a suite (it needs clients/node's npm ci):
#
#   (cd clients/node && npm ci)
#   PG_CONFIG=$(bash portable/server.sh) bash portable/relay_smoke.sh
#
# Prints one JSON line; exit 0 when it holds.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$top/idempotency.control")
script=$here/build/idempotency--$version.sql
PG_CONFIG=${PG_CONFIG:-pg_config}
perl "$here/build.pl" "$top/idempotency--$version.sql" "$here/src" >"$script" 2>/dev/null || exit 1
. "$top/test/cluster.sh"
trap cluster_stop EXIT
cluster_start >/dev/null || exit 1
"$PG_BINDIR/psql" -qX -v ON_ERROR_STOP=1 -f "$script" >/dev/null || exit 1
"$PG_BINDIR/psql" -qX -v ON_ERROR_STOP=1 -c "SELECT idempotency.create_topic('smoke')" >/dev/null || exit 1
NODE_PATH=$top/clients/node/node_modules TOP=$top node - <<'JS'
'use strict';
const pg = require('pg');
const { relay } = require(process.env.TOP + '/clients/node');
const pool = new pg.Pool({ max: 6 });
const seen = new Map();
const errors = [];
let n = 0;
const waiters = [];
const delivered = () => new Promise(res => waiters.push(res));
const r = relay('smoke', async m => {
	const last = seen.get(m.key) ?? -1;
	if (m.payload.i <= last) errors.push(`order: ${m.key} ${m.payload.i} after ${last}`);
	seen.set(m.key, m.payload.i);
	n++;
	if (n === 100 || n === 200) waiters.splice(0).forEach(w => w());
}, { pool, batchSize: 10, concurrency: 4, pollIntervalMs: 5000, handleSignals: false, onError: e => errors.push(e.message) });
const within = (p, ms) => Promise.race([p, new Promise(res => setTimeout(res, ms))]);
(async () => {
	const c = new pg.Client();
	await c.connect();
	const first = delivered();
	await c.query("SELECT count(idempotency.publish('smoke', jsonb_build_object('i', i), 'k' || (i % 10))) FROM generate_series(0, 99) i");
	await within(first, 30000);
	// the relay claims nothing now and waits in wait_for() (up to 5 s)
	const second = delivered();
	const t = Date.now();
	await c.query("SELECT count(idempotency.publish('smoke', jsonb_build_object('i', i), 'k' || (i % 10))) FROM generate_series(100, 199) i");
	await within(second, 30000);
	const ms = Date.now() - t;
	r.stop();
	await r.done;
	const { rows } = await c.query("SELECT count(*) FILTER (WHERE state = 'delivered')::int AS delivered, count(*)::int AS messages FROM idempotency.outbox_message");
	const ok = n === 200 && errors.length === 0 && !r.polling && ms < 5000 && rows[0].delivered === 200 && rows[0].messages === 200;
	console.log(JSON.stringify({ ok, handled: n, second_batch_ms: ms, errors, counts: r.counts, rows: rows[0], polling: r.polling }));
	await c.end();
	await pool.end();
	process.exit(ok ? 0 : 1);
})().catch(e => { console.error(e); process.exit(1); });
JS
