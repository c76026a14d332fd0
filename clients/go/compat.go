package idempotency

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Version is this module's version; it goes with the extension of the same
// version (docs/clients.md, "Versions").
const Version = "0.6.0"

// ExtensionMin is the oldest idempotency extension this module works with:
// its own major.minor, .0.  The middleware, RunPhases and Once on a *sql.DB
// ask the database once per *sql.DB (one query, on its first guarded
// request) and refuse an older extension with *ExtensionVersionError; a
// refusal is not remembered, so after ALTER EXTENSION idempotency UPDATE
// the next request asks again and goes through.
const ExtensionMin = "0.6.0"

// the extension's version; a plain install of the portable edition (psql -f,
// no extension) records it in the schema's comment instead
const versionSQL = "SELECT COALESCE((SELECT e.extversion FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')," +
	" (SELECT pg_catalog.substring(pg_catalog.obj_description(n.oid, 'pg_namespace'), '^idempotency ([0-9.]+) \\(portable edition\\)$')" +
	" FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency')) AS extversion"

// ExtensionVersionError: the database's extension is older than
// ExtensionMin (Found), or not installed (Found empty).
type ExtensionVersionError struct {
	Found  string
	Needed string
}

func (e *ExtensionVersionError) Error() string {
	if e.Found == "" {
		return fmt.Sprintf("idempotency-go %s needs the idempotency extension %s or newer; "+
			"it is not installed in this database (CREATE EXTENSION idempotency, or psql -f of the portable edition)", Version, e.Needed)
	}
	return fmt.Sprintf("idempotency-go %s needs the idempotency extension %s or newer; "+
		"this database has %s (ALTER EXTENSION idempotency UPDATE; a plain install: the portable upgrade script)", Version, e.Needed, e.Found)
}

var (
	checked        sync.Map // *sql.DB -> the extension's version
	versionQueries atomic.Int64
)

func versionParts(v string) [3]int {
	var p [3]int
	for i, s := range strings.SplitN(v, ".", 3) {
		p[i], _ = strconv.Atoi(s)
	}
	return p
}

func olderThan(a, b string) bool {
	x, y := versionParts(a), versionParts(b)
	for i := range x {
		if x[i] != y[i] {
			return x[i] < y[i]
		}
	}
	return false
}

// checkExtension: the extension's version for db, asked with q (db, or a
// transaction of db) the first time only.
func checkExtension(ctx context.Context, db *sql.DB, q Querier) error {
	if _, ok := checked.Load(db); ok {
		return nil
	}
	versionQueries.Add(1)
	var found sql.NullString
	err := q.QueryRowContext(ctx, versionSQL).Scan(&found)
	if err != nil && err != sql.ErrNoRows {
		return err
	}
	if !found.Valid || olderThan(found.String, ExtensionMin) {
		return &ExtensionVersionError{Found: found.String, Needed: ExtensionMin}
	}
	checked.Store(db, found.String)
	return nil
}
