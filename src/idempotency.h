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
 * Headers: this one (what every floor needs: the SQLSTATEs, KeyId, the
 * ground floor's runas.c, sharedhash.c and cache.c, and owners.c's entries
 * for the library's load, the workers and the topics), guard.h (the
 * guard's begin and finish, GuardBegin), keystore.h (the key store's
 * entries, StoredKey, HeldKey), keycitus.h (the Citus module's),
 * lifecycle.h (the purge and the workers), stats.h (what idempotency.stats
 * counts), one per outbox module that exports (outbox_topics.h,
 * outbox_claims.h, outbox_counts.h, outbox_vacuum.h, wakeup.h), target.h
 * (the write helpers'), compat.h (every PostgreSQL version difference).  Each file defines the GUCs it
 * reads in its idem_xxx_init(), as statics where no other file reads them.
 * Every non-static symbol starts with idem_ (SQL-callable functions with
 * idempotency_).
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

/* ---- features ---- */

/* owners.c */
extern void idem_owners_init(void);
extern void idem_owners_sweep(void);
extern void idem_owners_topic_gone(int32 topic_id);

#endif							/* IDEMPOTENCY_H */
