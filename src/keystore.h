/*-------------------------------------------------------------------------
 *
 * keystore.h
 *	  The key store (keystore.c, stores floor): a key's identity, the rows
 *	  of idempotency.idempotency_key and the key lock, one entry per
 *	  operation.  For the guard and the features over it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYSTORE_H
#define KEYSTORE_H

#include "idempotency.h"
#include "keycitus.h"

extern void idem_keystore_init(void);

/*
 * A key's record in this transaction: the guard keeps them (guard.c, its
 * held keys); the key store writes a row from one (idem_keystore_write())
 */
typedef enum HeldState
{
	HELD_BEGUN,					/* begin() returned new/retry; work pending */
	HELD_LEASED,				/* begin(lease) wrote an in_progress row */
	HELD_COMPLETED,				/* complete() wrote the row */
	HELD_FAILED					/* fail() wrote the row */
} HeldState;

typedef struct HeldKey
{
	struct HeldKey *below;		/* next older record of this transaction */
	struct HeldKey *older;		/* next older record with the same hash */
	SubTransactionId subid;		/* subtransaction that made this record */
	KeyId		id;				/* strings live in TopTransactionContext */
	HeldState	state;
	bool		row_exists;		/* a row (maybe expired) is in the table */
	int32		attempts;
	TimestampTz created_at;
	TimestampTz expires_at;
	TimestampTz locked_until;	/* lease end; 0 = none */
	bool		reset_point;	/* new work over an expired row: the next
								 * write clears its recovery point */
	bool		has_hash;
	uint8		request_hash[FINGERPRINT_LEN];
} HeldKey;

/* a key's identity: built, validated (IK003), hashed, described */
extern int	idem_max_key_length;
extern KeyId idem_make_keyid(text *key, text *scope, const char *what);
extern KeyId idem_keyid(FunctionCallInfo fcinfo, int keyarg, int scopearg,
						const char *what);
extern uint64 idem_key_hash(const KeyId *id);
extern char *idem_describe_key(const KeyId *id);
extern char *idem_scope_arg(FunctionCallInfo fcinfo, int scopearg);
extern void idem_unique128(uint8 *out);
extern TimestampTz idem_expiry(FunctionCallInfo fcinfo, int ttlarg,
							   TimestampTz now);
extern int32 idem_seconds_until(TimestampTz until, TimestampTz now);

/* the key lock */
typedef enum KeyLockResult
{
	KEYLOCK_TAKEN,				/* this call took the lock */
	KEYLOCK_HELD,				/* this transaction held it already */
	KEYLOCK_BUSY				/* another transaction holds it */
} KeyLockResult;

extern bool idem_keylock_busy(const KeyId *id);

/* a key's row as read */
typedef struct StoredKey
{
	bool		found;
	char		status;			/* 'i'n_progress, 'c'ompleted, 'f'ailed */
	bool		has_hash;
	uint8		request_hash[FINGERPRINT_LEN];
	Jsonb	   *response;		/* NULL when SQL NULL */
	bool		retryable;
	int32		attempts;
	TimestampTz created_at;
	TimestampTz updated_at;
	TimestampTz expires_at;
	TimestampTz locked_until;	/* 0 when NULL */
	text	   *recovery_point; /* NULL when SQL NULL or no such column */
	Jsonb	   *recovery_state; /* NULL when SQL NULL or no such column */
} StoredKey;

/* read */
extern void idem_keystore_peek(const KeyId *id, StoredKey *out,
							   MemoryContext outcxt);
extern bool idem_keystore_seed(const KeyId *id, bytea **seed,
							   TimestampTz *created_at);

/*
 * The guard's operations, one call each: begin() opens its key (routed,
 * its expiry, locked, read or claimed); a lease's holder holds it (locked,
 * the row locked where it lives)
 */
typedef struct KeyOpen
{
	bool		routed;			/* Citus: the key's shard is on another node;
								 * nothing else was done */
	TimestampTz expires_at;		/* a new row's: now + ttl */
	bool		claimed;		/* Citus: this call wrote the in_progress row */
	bool		finished;		/* stored is live and finished: a replay (the
								 * lock was given back) */
	StoredKey	stored;			/* the row; found false: none */
} KeyOpen;

extern void idem_keystore_open(const KeyId *id, const uint8 *hash,
							   const Interval *ttl, TimestampTz now,
							   KeyOpen *out, MemoryContext cxt);
extern void idem_keystore_hold(const KeyId *id, StoredKey *out,
							   MemoryContext cxt);

/* forget()'s, one call each: take its key (without waiting), delete it */
extern KeyLockResult idem_keystore_take(const KeyId *id, StoredKey *out,
										MemoryContext cxt);
extern bool idem_keystore_delete(const KeyId *id);

/* write */
extern void idem_keystore_write(const HeldKey *h, const char *status,
								Jsonb *response, bool retryable_null,
								bool retryable);
extern uint64 idem_keystore_checkpoint(const KeyId *id, text *point,
									   Jsonb *state);

/* the table's version: the columns of 0.5.0 (recovery) and 0.6.0 (seed) */
extern bool idem_keystore_has_recovery(void);
extern bool idem_keystore_has_seed(void);

/* the extension's other tables Citus may distribute */
typedef enum IdemTable
{
	IDEM_TABLE_TOKEN,			/* idempotency.token */
	IDEM_TABLE_SEEN,			/* idempotency.seen_message */
	IDEM_TABLE_MACHINE,			/* idempotency.state_machine */
	IDEM_NTABLES
} IdemTable;

extern bool idem_table_distributed(IdemTable t);

/* Citus: a call carried to the node of its shard, a statement on a shard here */
typedef enum IdemRoute
{
	IDEM_ROUTE_KEYS,			/* idempotency.key_route: keys, seen messages */
	IDEM_ROUTE_TOKENS,			/* idempotency.token_route: tokens */
	IDEM_NROUTES
} IdemRoute;

extern bool idem_route_key(const KeyId *id);
extern bool idem_route_arrived(void);
extern bool idem_route_table(IdemTable t, const char *value, int len);
extern Datum idem_route_exec(IdemRoute via, Datum value, const char *fn,
							 int nargs, const Oid *argtypes, const Datum *args,
							 const bool *argnulls, Oid rettype,
							 SPIPlanPtr *cache, bool *isnull);
extern Datum idem_route_call(FunctionCallInfo fcinfo, IdemRoute via,
							 Datum value, SPIPlanPtr *cache);
extern bool idem_shard_exec(IdemTable t, const char *value, int len,
							const char *shell, const char *sql, int nargs,
							Oid *argtypes, Datum *values, const char *nulls,
							int expect_rc, uint64 *processed);

#endif							/* KEYSTORE_H */
