/*-------------------------------------------------------------------------
 *
 * keycitus.h
 *	  Citus (keycitus.c, citus floor): whether a table is distributed,
 *	  whether a key's shard is on this node, the key table's statements on
 *	  Citus, and the pieces of the key table's statements both the key
 *	  store (keystore.c) and those statements use.
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYCITUS_H
#define KEYCITUS_H

#include "idempotency.h"

/*
 * SQL comparing an owner column with a parameter (a regrole).  On a single
 * server the owner columns are regrole.  On a table Citus knows they are
 * idempotency.roleref (distribute() converts them): a role's oid on disk,
 * like regrole, but with no binary send/receive functions, so every copy
 * between nodes (a shard move's COPY, logical replication's apply, a node
 * added later, a reference table's copy, a parameter or a constant Citus
 * sends to a worker) carries the role's name, and each node stores its own
 * oid of that role.  So a row stays with its role across ALTER ROLE ...
 * RENAME (Citus renames the role on every node; oids do not change) and a
 * role created later under an old name is another role.  roleref casts to
 * oid implicitly and without a function (as regrole does), so the
 * comparison is oid equality on both kinds of table, served by the primary
 * key (oid_ops).  On Citus the comparison is OPERATOR(idempotency.===)
 * (roleref, regrole), whose right side stays a regrole: Citus evaluates an
 * UPDATE's or DELETE's parameters on the coordinator and sends them as
 * constants, and a regrole constant travels by name (relabelled to oid it
 * would carry the coordinator's oid).  0.5.0 stored the role's name as
 * text on Citus: a renamed role's retry found no key and paid again.
 */
#define IDEM_OWNER_EQ(col, param) \
	col " OPERATOR(pg_catalog.=) " param
#define IDEM_OWNER_EQ_CITUS(col, param) \
	col " OPERATOR(idempotency.===) " param

/* is relid a table Citus knows (a row of pg_dist_partition)? */
extern bool idem_citus_table(Oid relid);

/* the key's shard, when it is on this node (its metadata lock then held) */
extern int64 idem_local_shard(Oid relid, const KeyId *id, Oid *shard_relid);
extern void idem_shard_inval(Oid relid);

/* the key table's statements on Citus (the same on the key's shard) */
typedef enum CitusStmt
{
	SS_CLAIM, SS_SELECT, SS_SELECT_RP, SS_LOCK, SS_LOCK_RP, SS_UPSERT,
	SS_UPSERT_RP, SS_CHECKPOINT, SS_DELETE, SS_N
} CitusStmt;

typedef struct ShardPlans ShardPlans;

extern ShardPlans *idem_store_shard(Oid relid, const KeyId *id);
extern uint64 idem_store_citus_run(ShardPlans *sp, CitusStmt k, int nargs,
								   Oid *argtypes, Datum *values,
								   const char *nulls, int expect_rc);

/* ---- pieces of the statements (every name qualified, every value $n) ---- */

#define KEY_WHERE \
	" WHERE " IDEM_OWNER_EQ("k.owner", "$1") \
	"   AND k.scope OPERATOR(pg_catalog.=) $2" \
	"   AND k.key OPERATOR(pg_catalog.=) $3"

/* on Citus: the owner by name (IDEM_OWNER_EQ_CITUS) */
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

#endif							/* KEYCITUS_H */
