/*-------------------------------------------------------------------------
 *
 * keystore.h
 *	  Declarations shared by the files of the key store (stores floor),
 *	  which read and write rows of idempotency.idempotency_key:
 *
 *	  keyread.c    lookups: the SQL path's SELECT, under the isolation rules
 *	  keywrite.c   writes: a key's outcome, a checkpoint, a Citus claim
 *	  keycitus.c   Citus: the statements through Citus's route or on the
 *	               key's shard on this node, and their plans
 *	  keyfast.c    the fast path: primary key probe, executor insert
 *	  keytable.c   the table: which it is, its shape, the path it takes
 *
 * keyread.c and keywrite.c use the three below them; keycitus.c and
 * keyfast.c use keytable.c; keytable.c none of them.  The rest of the
 * extension sees only idempotency.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYSTORE_H
#define KEYSTORE_H

#include "access/htup.h"
#include "storage/lockdefs.h"
#include "utils/rel.h"

#include "idempotency.h"

/* ---- keytable.c ---- */

/* the columns the guard reads and writes, in $n order of the statements */
typedef enum StoreCol
{
	COL_OWNER, COL_SCOPE, COL_KEY, COL_STATUS, COL_REQUEST_HASH, COL_RESPONSE,
	COL_RETRYABLE, COL_ATTEMPTS, COL_CREATED_AT, COL_UPDATED_AT,
	COL_EXPIRES_AT, COL_LOCKED_UNTIL,
	/* since 0.5.0 (recovery points); a 0.4.0 table has none of them */
	COL_RECOVERY_POINT, COL_RECOVERY_STATE,
	/* since 0.6.0 (derive_key()'s per-key seed); a 0.5.0 table has none */
	COL_DERIVE_SEED, NUM_COLS
} StoreCol;

/* the columns every version has (the row written by INSERT and UPDATE) */
#define NUM_BASE_COLS COL_RECOVERY_POINT

/*
 * A write's $13 (values[SEED_ARG]; the recovery point columns are never
 * written from these arrays): the derive_seed of a row written now, on a
 * table that has the column (idem_store.seed).  idem_store_write_types is
 * idem_store_col_types' first twelve and bytea.
 */
#define SEED_ARG NUM_BASE_COLS
#define NUM_SEED_ARGS (NUM_BASE_COLS + 1)
extern Oid	idem_store_write_types[NUM_SEED_ARGS];
extern bytea *idem_store_new_seed(void);

/* the key table as idem_store_resolve() found it (keytable.c) */
typedef struct KeyStore
{
	Oid			relid;			/* InvalidOid: not resolved, or changed */
	bool		fast;			/* the fast path (keytable.c's file comment) */
	bool		recovery;		/* has the recovery point columns */
	bool		seed;			/* has derive_seed (0.6.0) */
	bool		citus;			/* distributed by Citus */
	AttrNumber	attnums[NUM_COLS];
} KeyStore;

extern KeyStore idem_store;
extern Oid	idem_store_col_types[NUM_COLS];

/* what the error context of a statement on the table says */
typedef struct StoreErrorArg
{
	const KeyId *id;
	const char *doing;			/* "reading", "storing" */
} StoreErrorArg;

extern void idem_store_error_context(void *arg);
extern void idem_store_bad_table(const char *detail);
extern void idem_store_resolve(void);
extern Relation idem_store_open(LOCKMODE lockmode);
extern void idem_store_key_values(const KeyId *id, Datum *values);
extern void idem_store_check_writable(const KeyId *id);

/* ---- keyfast.c ---- */
extern bool idem_store_probe(Relation heap, const KeyId *id, Snapshot snap,
							 StoredKey *out, MemoryContext outcxt,
							 TransactionId *xmin);
extern void idem_store_insert(Relation rel, Datum *values, const char *nulls);

/* ---- keycitus.c ---- */

/* the statements on a table Citus knows (the same on the key's shard) */
typedef enum CitusStmt
{
	SS_CLAIM, SS_SELECT, SS_SELECT_RP, SS_LOCK, SS_LOCK_RP, SS_UPSERT,
	SS_UPSERT_RP, SS_CHECKPOINT, SS_DELETE, SS_N
} CitusStmt;

typedef struct ShardPlans ShardPlans;

extern ShardPlans *idem_store_shard(const KeyId *id);
extern uint64 idem_store_citus_run(ShardPlans *sp, CitusStmt k, int nargs,
								   Oid *argtypes, Datum *values,
								   const char *nulls, int expect_rc);

/* ---- pieces of the statements (every name qualified, every value $n) ---- */

#define KEY_WHERE \
	" WHERE " IDEM_OWNER_EQ("k.owner", "$1") \
	"   AND k.scope OPERATOR(pg_catalog.=) $2" \
	"   AND k.key OPERATOR(pg_catalog.=) $3"

/* on Citus: the owner by name (idempotency.h) */
#define KEY_WHERE_CITUS \
	" WHERE " IDEM_OWNER_EQ_CITUS("k.owner", "$1") \
	"   AND k.scope OPERATOR(pg_catalog.=) $2" \
	"   AND k.key OPERATOR(pg_catalog.=) $3"

/* columns in StoredKey order, cast to the types the guard reads */
#define SELECT_BASE \
"SELECT k.status::pg_catalog.text, k.request_hash::pg_catalog.bytea," \
"       k.response::pg_catalog.jsonb, k.retryable::pg_catalog.bool," \
"       k.attempts::pg_catalog.int4, k.created_at::pg_catalog.timestamptz," \
"       k.expires_at::pg_catalog.timestamptz," \
"       k.locked_until::pg_catalog.timestamptz, k.xmin," \
"       k.updated_at::pg_catalog.timestamptz"

/* the recovery point (columns 11 and 12), since 0.5.0 */
#define SELECT_RP \
", k.recovery_point::pg_catalog.text, k.recovery_state::pg_catalog.jsonb"
#define FROM_KEYS "  FROM idempotency.idempotency_key AS k"

#endif							/* KEYSTORE_H */
