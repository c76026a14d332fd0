'use strict';
// compat.js: the client refuses a database whose idempotency extension is
// older than it needs (docs/clients.md, "Versions").  Asked once per pool:
// the first guarded request (or runPhases, or relay) on a pool sends one
// query; every later one reuses the answer, so a request costs no extra
// round trip.  A refusal is not remembered: after ALTER EXTENSION
// idempotency UPDATE the next request asks again and goes through.

const VERSION = require('../package.json').version;
// the oldest extension this client works with: its own major.minor
const EXTENSION_MIN = VERSION.replace(/^(\d+)\.(\d+)\..*$/, '$1.$2.0');
// the extension's version; a plain install of the portable edition (psql -f,
// no extension) records it in the schema's comment instead
const VERSION_SQL = "SELECT COALESCE((SELECT e.extversion FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')," +
	" (SELECT pg_catalog.substring(pg_catalog.obj_description(n.oid, 'pg_namespace'), '^idempotency ([0-9.]+) \\(portable edition\\)$')" +
	" FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency')) AS extversion";

const checked = new WeakMap();	// pool -> Promise<string>, the extension's version
let queries = 0;			// version queries sent (the tests count them)

function parts(v) { return String(v).split('.').map(n => parseInt(n, 10) || 0); }
function older(a, b) {
	const x = parts(a), y = parts(b);
	for (let i = 0; i < Math.max(x.length, y.length); i++)
		if ((x[i] || 0) !== (y[i] || 0)) return (x[i] || 0) < (y[i] || 0);
	return false;
}

class ExtensionVersionError extends Error {
	constructor(found) {
		super(found === null
			? `pg-idempotency ${VERSION} needs the idempotency extension ${EXTENSION_MIN} or newer; ` +
				'it is not installed in this database (CREATE EXTENSION idempotency, or psql -f of the portable edition)'
			: `pg-idempotency ${VERSION} needs the idempotency extension ${EXTENSION_MIN} or newer; ` +
				`this database has ${found} (ALTER EXTENSION idempotency UPDATE; a plain install: the portable upgrade script)`);
		this.name = 'ExtensionVersionError';
		this.found = found;
		this.needed = EXTENSION_MIN;
	}
}

// checkExtension(pool, via = pool): resolves to the extension's version, or
// rejects with ExtensionVersionError; `via` (a client of the pool, or the
// pool) sends the query the first time.
function checkExtension(pool, via = pool) {
	let p = checked.get(pool);
	if (!p) {
		queries++;
		p = via.query(VERSION_SQL).then(r => {
			const found = r.rows.length ? r.rows[0].extversion : null;
			if (found === null || older(found, EXTENSION_MIN)) throw new ExtensionVersionError(found);
			return found;
		});
		p.catch(() => { if (checked.get(pool) === p) checked.delete(pool); });
		checked.set(pool, p);
	}
	return p;
}

module.exports = { VERSION, EXTENSION_MIN, ExtensionVersionError, checkExtension, versionQueries: () => queries };
