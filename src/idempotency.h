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
#include "utils/jsonb.h"

/* Our SQLSTATEs (SPEC.md section 4) */
#define ERRCODE_IDEMPOTENCY_KEY_REUSED		MAKE_SQLSTATE('I','K','0','0','1')
#define ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS MAKE_SQLSTATE('I','K','0','0','2')
#define ERRCODE_INVALID_IDEMPOTENCY_KEY		MAKE_SQLSTATE('I','K','0','0','3')
#define ERRCODE_IDEMPOTENCY_KEY_NOT_HELD	MAKE_SQLSTATE('I','K','0','0','4')

#define FINGERPRINT_LEN 32		/* sha256 */

/* Upper bound of key + scope in bytes, well below the btree tuple limit */
#define MAX_KEY_BYTES 2048

/* GUCs (idempotency.c) */
extern int	idem_lock_wait_ms;
extern int	idem_default_ttl_s;
extern int	idem_max_key_length;

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
	bool		has_hash;
	uint8		request_hash[FINGERPRINT_LEN];
} HeldKey;

extern void HeldKeysInit(void);
extern HeldKey *held_lookup(const KeyId *id);
extern HeldKey *held_push(const HeldKey *proto);

/* keylock.c */
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
} StoredKey;

extern void KeystoreInit(void);
extern void keystore_lookup(const KeyId *id, StoredKey *out,
							MemoryContext outcxt);
extern void keystore_write(const HeldKey *h, const char *status,
						   Jsonb *response, bool retryable_null,
						   bool retryable);

/* guard.c */
extern char *describe_key(const KeyId *id);

#endif							/* IDEMPOTENCY_H */
