// node-postgres: once() as one statement in autocommit, every parameter an
// ordinary (untyped) bind parameter, as node-postgres always sends them.
'use strict';
const { Client } = require('pg');

const INSERT = 'INSERT INTO drv_payment (amount, note) VALUES ($1, $2) RETURNING amount, note';
const ONCE = 'SELECT outcome, response FROM idempotency.once($1, $2, $3, $4, $5)';
// key order, whitespace, escapes and non-ASCII that jsonb would not keep
const BODY = '{"zeta": 1,  "alpha": [1.10, 2e3],\n\t"t": "caf\\u00e9 é 😀 \\"q\\""}\r\n';

let failures = 0;
function check(desc, cond, extra) {
  if (!cond) failures++;
  console.log(`${cond ? 'ok' : 'not ok'} - node-postgres: ${desc}${!cond && extra !== undefined ? ' (got ' + JSON.stringify(extra) + ')' : ''}`);
}
async function sqlstate(client, text, params) {
  try { await client.query(text, params); return 'no error'; } catch (e) { return e.code; }
}

(async () => {
  const c = new Client();
  await c.connect();
  const req = JSON.stringify({ amount: '49.90' });

  let r = await c.query(ONCE, ['node-1', req, INSERT, '49.90', 'node-1']);
  check('new: the work ran once, its row is the response',
    r.rows[0].outcome === 'new' && r.rows[0].response.note === 'node-1' &&
    r.rows[0].response.amount === 49.9, r.rows[0]);
  r = await c.query(ONCE, ['node-1', req, INSERT, '49.90', 'node-1']);
  check('replay: the stored response comes back',
    r.rows[0].outcome === 'replay' && r.rows[0].response.note === 'node-1', r.rows[0]);
  r = await c.query("SELECT count(*)::int AS n FROM drv_payment WHERE note = 'node-1'");
  check('replay: the work did not run again', r.rows[0].n === 1, r.rows[0]);

  check('another request under the same key: IK001',
    await sqlstate(c, ONCE, ['node-1', '{"amount": "1"}', INSERT, '1', 'node-1']) === 'IK001');
  check('an error in the work: its SQLSTATE (22P02)',
    await sqlstate(c, ONCE, ['node-2', null, INSERT, 'lots', 'node-2']) === '22P02');
  r = await c.query('SELECT count(*)::int AS n FROM idempotency.lookup($1)', ['node-2']);
  check('an error in the work: nothing stored', r.rows[0].n === 0, r.rows[0]);

  const http = 'SELECT idempotency.http_response(201, $1, $2::jsonb) AS r';
  const headers = JSON.stringify({ 'Content-Type': 'application/json', Location: '/p/1' });
  await c.query(ONCE, ['node-3', null, http, BODY, headers]);
  r = await c.query(ONCE, ['node-3', null, http, BODY, headers]);
  const resp = r.rows[0].response;
  check('HTTP replay: status and headers',
    r.rows[0].outcome === 'replay' && resp.status === 201 && resp.headers.Location === '/p/1', resp);
  check('HTTP replay: the body byte for byte',
    Buffer.from(resp.body, 'utf8').equals(Buffer.from(BODY, 'utf8')), resp.body);

  r = await c.query('SELECT status, attempts, retry_after FROM idempotency.lookup($1, $2)', ['node-1', '']);
  check('lookup(): completed, no retry needed',
    r.rows.length === 1 && r.rows[0].status === 'completed' && r.rows[0].retry_after === null, r.rows);
  await c.end();
  process.exit(failures ? 1 : 0);
})().catch((e) => { console.log(`not ok - node-postgres: ${e.message}`); process.exit(1); });
