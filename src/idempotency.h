/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *	  Declarations shared by the files of the idempotency extension.
 *
 * The files form floors.  A file calls only files on its own floor or
 * below, never above, and no files call each other round a circle.
 * test/layers/run (`make test`, suite layers) reads the floor lines below
 * (one per floor, top first: "floor NAME: files") and checks both against
 * the symbols of the built objects (nm); a file on no floor fails it too.
 * What each file owns, its locking and the path of a request:
 * src/README.md.
 *
 *	  floor top:      idempotency.c worker.c
 *	  floor features: once.c lookup.c http.c ops.c recovery.c lifecycle.c outbox_publish.c outbox_relay.c outbox_topics.c outbox_counts.c outbox_vacuum.c owners.c
 *	  floor guard:    guard.c
 *	  floor helpers:  machine.c versioned.c insert_once.c
 *	  floor target:   target.c
 *	  floor stores:   keystore.c
 *	  floor citus:    keycitus.c
 *	  floor ground:   stats.c sharedhash.c wakeup.c outbox_claims.c runas.c cache.c
 *
 * Headers: this one (the ground floor's, the guard's and the features'
 * exported declarations, the SQLSTATEs, KeyId, HeldKey), keystore.h (the
 * key store's entries, StoredKey), keycitus.h (the Citus module's),
 * stats.h (what idempotency.stats counts), one per outbox module that
 * exports (outbox_topics.h, outbox_claims.h, outbox_counts.h,
 * outbox_vacuum.h, wakeup.h), target.h (the write helpers'), compat.h
 * (every PostgreSQL version difference).  Each file
 * defines the GUCs it reads in its idem_xxx_init().  Every non-static
 * symbol starts with idem_ (SQL-callable functions with idempotency_).
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
#include "utils/relcache.h"
#include "utils/snapshot.h"
#include "utils/uuid.h"

/* Our SQLSTATEs (docs/reference.md, "Errors") */
#define ERRCODE_IDEMPOTENCY_KEY_REUSED		MAKE_SQLSTATE('I','K','0','0','1')
#define ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS MAKE_SQLSTATE('I','K','0','0','2')
#define ERRCODE_INVALID_IDEMPOTENCY_KEY		MAKE_SQLSTATE('I','K','0','0','3')
#define ERRCODE_IDEMPOTENCY_KEY_NOT_HELD	MAKE_SQLSTATE('I','K','0','0','4')
#define ERRCODE_INVALID_STATE_TRANSITION	MAKE_SQLSTATE('I','K','0','0','5')
#define ERRCODE_STALE_VERSION				MAKE_SQLSTATE('I','K','0','0','6')

#define FINGERPRINT_LEN 32		/* sha256 */

/* Upper bound of key + scope in bytes, well below the btree tuple limit */
#define MAX_KEY_BYTES 2048

/* GUCs, each defined by the file named */
extern int	idem_purge_interval_s;	/* worker.c */
extern int	idem_purge_batch;	/* worker.c */
extern int	idem_purge_timeout_s;	/* worker.c */
extern char *idem_database;		/* worker.c */
extern int	idem_stats_max;		/* stats.c */

/*
 * The identity of one key: (owner role, scope, key).  hash is a keyed 64-bit
 * hash of the three (the key store's, keystore.h), used for the key lock tag
 * and the per-transaction table.
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

/* ---- ground floor ---- */

/* cache.c: the library's one relcache callback, registered on first use */
typedef void (*IdemRelcacheCallback) (Oid relid);
extern void idem_relcache_add(IdemRelcacheCallback fn);
extern void idem_relcache_watch(void);

/* runas.c */
typedef struct SavedUser
{
	Oid			userid;
	int			sec_context;
} SavedUser;

extern void idem_runas_init(void);
extern void idem_prepare(SPIPlanPtr *cache, const char *sql, int nargs,
						 Oid *argtypes);
extern void idem_as_owner(SavedUser *saved);
extern void idem_as_caller(const SavedUser *saved);
extern uint64 idem_run_as_owner(SPIPlanPtr *cache, const char *sql, int nargs,
								Oid *argtypes, Datum *values,
								const char *nulls, int expect_rc);
extern uint64 idem_run_as(bool as_owner, SPIPlanPtr *cache, const char *sql,
						  int nargs, Oid *argtypes, Datum *values,
						  const char *nulls, int expect_rc);
extern uint64 idem_run_as_owner_once(const char *sql, int nargs,
									 Oid *argtypes, Datum *values,
									 const char *nulls, int expect_rc);
extern uint64 idem_run_as_owner_snap(SPIPlanPtr *cache, const char *sql,
									 int nargs, Oid *argtypes, Datum *values,
									 const char *nulls, int expect_rc,
									 Snapshot snap);
extern void idem_insert_as_owner(Relation rel, const Datum *values,
								 const bool *nulls);

/*
 * sharedhash.c: a hash table in shared memory (preloaded), whose entries
 * begin with two Oids: the database, then the install or the role
 */
typedef struct IdemSharedHash
{
	const char *name;			/* of its lock's tranche and struct */
	const char *hash_name;		/* of the hash table */
	Size		keysize;
	Size		entrysize;
	struct LWLock *lock;		/* set by idem_sharedhash_attach() */
	struct HTAB *hash;			/* likewise; NULL: not preloaded */
} IdemSharedHash;

extern void idem_sharedhash_request(const IdemSharedHash *t, long max);
extern bool idem_sharedhash_attach(IdemSharedHash *t, long max);
extern void idem_sharedhash_forget(const IdemSharedHash *t, Oid db, Oid owner);
extern int	idem_sharedhash_databases(const IdemSharedHash *t, Oid *dbs, int max);

/*
 * A key's record in this transaction: the guard's held keys (guard.c), from
 * which the key store writes a row
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

/* ---- features ---- */

/* owners.c */
extern void idem_owners_init(void);
extern void idem_owners_sweep(void);
extern void idem_owners_topic_gone(int32 topic_id);

/* lifecycle.c */
#define PURGE_NTABLES 4			/* keys, tokens, seen messages, outbox
								 * messages */
extern int64 idem_purge_expired(Oid owner, int batch_size, TimestampTz now,
								int64 *counts);

/* guard.c */
typedef enum GuardOutcome
{
	GUARD_NEW,					/* first time: do the work */
	GUARD_RETRY,				/* an earlier attempt failed retryably or
								 * lapsed */
	GUARD_REPLAY,				/* finished: return the stored response */
	GUARD_ROUTED				/* Citus: the key's shard is on another node;
								 * the caller carries the call there */
} GuardOutcome;

typedef struct GuardBegin
{
	GuardOutcome outcome;
	char		status;			/* 'i'n_progress, 'c'ompleted, 'f'ailed */
	Jsonb	   *response;		/* stored response (replay, retry), or NULL */
	int32		attempts;
	TimestampTz created_at;
	text	   *recovery_point; /* last checkpoint (retry, replay), or NULL */
	Jsonb	   *recovery_state;
} GuardBegin;

extern void idem_guard_init(void);
extern HeldKey *idem_held_lookup(const KeyId *id);
extern TupleDesc idem_result_desc(FunctionCallInfo fcinfo);
extern void idem_guard_begin(const KeyId *id, Jsonb *request,
							 const Interval *ttl, const Interval *lease,
							 GuardBegin *out);
extern void idem_guard_finish(const KeyId *id, HeldState newstate,
							  Jsonb *payload, bool retryable,
							  bool has_attempt, int32 attempt);
extern void idem_guard_lease_holder(const KeyId *id, int32 attempt,
									HeldKey *h);

/* ---- top ---- */

/* worker.c */
extern void idem_worker_init(void);

#endif							/* IDEMPOTENCY_H */
