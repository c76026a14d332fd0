/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *	  Declarations shared by the files of the idempotency extension.
 *
 * The extension is split by concern:
 *	  idempotency.c  module load, GUCs
 *	  fingerprint.c  sha256 of a canonical jsonb encoding
 *	  heldkeys.c	 per-transaction memory of the keys this transaction
 *					 began, completed or failed (savepoint aware; commit check)
 *	  keylock.c		 the heavyweight lock that serialises one key
 *	  keystore.c	 SPI access to idempotency.idempotency_key
 *	  guard.c		 SQL-callable begin(), complete(), fail()
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/jsonb.h"

/* Our SQLSTATEs (SPEC.md section 4) */
#define ERRCODE_IDEMPOTENCY_KEY_REUSED		MAKE_SQLSTATE('I','K','0','0','1')
#define ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS MAKE_SQLSTATE('I','K','0','0','2')
#define ERRCODE_INVALID_IDEMPOTENCY_KEY		MAKE_SQLSTATE('I','K','0','0','3')
#define ERRCODE_IDEMPOTENCY_KEY_NOT_HELD	MAKE_SQLSTATE('I','K','0','0','4')
#define ERRCODE_INVALID_STATE_TRANSITION	MAKE_SQLSTATE('I','K','0','0','5')
#define ERRCODE_STALE_VERSION				MAKE_SQLSTATE('I','K','0','0','6')

#define FINGERPRINT_LEN 32		/* sha256 */

/* Upper bound of key + scope in bytes, well below the btree tuple limit */
#define MAX_KEY_BYTES 2048

/* GUCs (idempotency.c) */
extern int	idem_lock_wait_ms;
extern int	idem_default_ttl_s;
extern int	idem_max_key_length;
extern int	idem_purge_interval_s;
extern int	idem_purge_batch;
extern char *idem_database;

/*
 * The identity of one key: (owner role, scope, key).  hash is a 64-bit hash
 * of the three, used for the key lock tag and the per-transaction table.
 */
typedef struct KeyId
{
	Oid			owner;
	const char *scope;			/* NUL-terminated, palloc'd */
	int			scope_len;		/* bytes */
	const char *key;
	int			key_len;
	uint64		hash;
} KeyId;

/* fingerprint.c */
extern void idem_fingerprint(Jsonb *jb, uint8 *out);

/* heldkeys.c */
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
	bool		has_hash;
	uint8		request_hash[FINGERPRINT_LEN];
} HeldKey;

extern void HeldKeysInit(void);
extern HeldKey *held_lookup(const KeyId *id);
extern HeldKey *held_push(const HeldKey *proto);

/* keylock.c */
typedef enum KeyLockResult
{
	KEYLOCK_TAKEN,				/* this call took the lock */
	KEYLOCK_HELD,				/* this transaction held it already */
	KEYLOCK_BUSY				/* another transaction holds it */
} KeyLockResult;

extern KeyLockResult keylock_try(const KeyId *id);
extern void keylock_wait(const KeyId *id);
extern bool keylock_acquire(const KeyId *id);
extern void keylock_release(const KeyId *id);

/* keystore.c */
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
	TimestampTz expires_at;
	TimestampTz locked_until;	/* 0 when NULL */
} StoredKey;

typedef struct SavedUser
{
	Oid			userid;
	int			sec_context;
} SavedUser;

extern void KeystoreInit(void);
extern void keystore_prepare(SPIPlanPtr *cache, const char *sql, int nargs,
							 Oid *argtypes);
extern void keystore_as_owner(SavedUser *saved);
extern void keystore_as_caller(const SavedUser *saved);
extern void keystore_key_values(const KeyId *id, Datum *values);
extern uint64 keystore_run(SPIPlanPtr *cache, const char *sql, int nargs,
						   Oid *argtypes, Datum *values, const char *nulls,
						   int expect_rc);
extern void keystore_lookup(const KeyId *id, StoredKey *out,
							MemoryContext outcxt);
extern void keystore_write(const HeldKey *h, const char *status,
						   Jsonb *response, bool retryable_null,
						   bool retryable);

/* lifecycle.c */
#define PURGE_NTABLES 3
extern int64 purge_expired(Oid owner, int batch_size, TimestampTz now,
						   int64 *counts);

/* worker.c */
extern void PurgeWorkerRegister(void);

/* guard.c */
extern char *describe_key(const KeyId *id);
extern KeyId idem_keyid(FunctionCallInfo fcinfo, int keyarg, int scopearg,
						const char *what);
extern char *idem_scope_arg(FunctionCallInfo fcinfo, int scopearg);
extern TimestampTz idem_expiry(FunctionCallInfo fcinfo, int ttlarg,
							   TimestampTz now);

#endif							/* IDEMPOTENCY_H */
