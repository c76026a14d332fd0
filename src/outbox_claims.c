/*-------------------------------------------------------------------------
 *
 * outbox_claims.c
 *	  The outbox's claims in shared memory: a claim writes no row version.
 *
 * With the library preloaded, claim() (outbox_relay.c) locks the messages
 * it hands out FOR UPDATE SKIP LOCKED for its statement's transaction and
 * enters each one here: (database, install, message id) -> claim token,
 * claimed until, attempt (the install: see ClaimKey).  The row stays as it is ('pending', available_at
 * unchanged), so a claim costs a row lock, not a row version.  ack()
 * deletes the row; nack() writes it (attempts, retry time, dead); release()
 * writes nothing.  Each ends the entry when its transaction commits
 * (end_at_commit below); a claim whose transaction aborts removes the
 * entries it made.  What the entries give the SQL statements:
 *
 *	idempotency._outbox_claimed(id)			claimed, and its claim not lapsed?
 *	idempotency._outbox_attempt(id, claim)	the claim's attempt, NULL if id
 *											is not held by that claim
 *	idempotency._outbox_claim(id)			the claim that holds id
 *
 * A lapsed entry stays until another claim takes the message over (then
 * that claim writes the lapsed attempt into the row: see outbox_relay.c) or
 * the table is full (then lapsed entries are dropped, and with them the
 * attempts they counted).  A crash or restart empties the table: every
 * claim lapses at once and the attempt in flight is not counted (attempts
 * of earlier lapsed claims are in the row already).  A takeover keeps the
 * lapsed claim it took over in its entry until its transaction commits:
 * ROLLBACK PREPARED, which runs none of this backend's callbacks, puts it
 * back when the entry is next looked at (claim_resolve), as an abort here
 * does at once.  DROP DATABASE, DROP EXTENSION and the drop of a topic
 * free their entries (owners.c); a full table also drops its database's
 * earlier installs'.
 *
 * The acked counts are outbox_counts.c's.
 *
 * Locking: claims.lock (an LWLock) guards the hash table: shared to look
 * up, exclusive to add, change or remove an entry.  Nothing waits while
 * holding it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "compat.h"
#include "idempotency.h"

#define CLAIMS_TRANCHE "idempotency outbox claims"

/*
 * The message and topic ids restart at 1 when the extension is dropped and
 * created again: each key also names the install, by the OID of its
 * outbox_message_id_seq (new with every CREATE EXTENSION in a database), so
 * that no entry passes to a message or topic that reuses its numbers
 * (outbox_counts.c keys its counts by the same: idem_outbox_install()).  A
 * database dropped and created again with CREATE DATABASE ... OID from the
 * same template has the same oid and the same sequence OID: its entries
 * are kept apart by being freed at the drop (owners.c).
 */
typedef struct ClaimKey
{
	Oid			db;
	Oid			gen;			/* outbox_message_id_seq's OID */
	int64		id;
} ClaimKey;

typedef struct ClaimEntry
{
	ClaimKey	key;
	pg_uuid_t	token;
	TimestampTz until;
	int32		attempt;
	int32		topic_id;
	TransactionId xid;			/* the claim's transaction until it commits
								 * (InvalidTransactionId after): a prepared
								 * one ends without this backend's callback */

	/*
	 * The lapsed claim this one took over, while xid is set (prior_attempt 0:
	 * none): ROLLBACK PREPARED of xid puts it back, so that its attempt still
	 * counts, as a plain rollback does (the row's attempts, which the
	 * takeover wrote, roll back with it)
	 */
	pg_uuid_t	prior_token;
	TimestampTz prior_until;
	int32		prior_attempt;
} ClaimEntry;

/* what this transaction does to the table at its end */
typedef enum PendingKind
{
	PENDING_MADE,				/* a claim's entry: removed if it aborts */
	PENDING_END					/* ack/nack/release: removed at commit */
} PendingKind;

typedef struct Pending
{
	PendingKind kind;
	Oid			gen;			/* the install (ClaimKey), read when added */
	int64		id;
	pg_uuid_t	token;
	int32		topic_id;
	int			level;			/* the (sub)transaction's nesting level */
	bool		took_over;		/* PENDING_MADE over a lapsed claim: put */
	ClaimEntry	before;			/* this back if it aborts (its attempt counts) */
} Pending;

int			idem_outbox_claims_max = 65536;

static IdemSharedHash claims = {
	.name = CLAIMS_TRANCHE,
	.hash_name = "idempotency outbox claims hash",
	.keysize = sizeof(ClaimKey),
	.entrysize = sizeof(ClaimEntry)
};
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static List *pending = NIL;		/* of Pending, in TopTransactionContext */
static bool callback_registered = false;
static Oid	gen_relid = InvalidOid; /* outbox_message_id_seq, cached */

static void claims_relcache(Oid relid);

/* ---------------------------------------------------------------------
 * Shared memory
 * ---------------------------------------------------------------------
 */
static void
claims_shmem_request(void)
{
	idem_sharedhash_request(&claims, idem_outbox_claims_max);
}

static void
claims_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	(void) idem_sharedhash_attach(&claims, idem_outbox_claims_max);
}

/* from _PG_init, before the prefix is reserved: the GUC; preloaded, the shared memory */
void
idem_outbox_claims_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("idempotency.outbox_claims",
							"Most outbox messages claimed at once (claims live in shared memory).",
							"A claim that finds the table full drops lapsed claims; if none, it claims fewer messages.",
							&idem_outbox_claims_max,
							65536, 64, INT_MAX / 64,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
	idem_request_shmem(claims_shmem_request);
	idem_relcache_add(claims_relcache);
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = claims_shmem_startup;
}

/* are claims held in shared memory?  (else claim() writes them into the row) */
bool
idem_outbox_claims_on(void)
{
	return claims.hash != NULL;
}

/*
 * This database's install of the extension: the OID of its
 * outbox_message_id_seq (InvalidOid without one), cached until a relcache
 * invalidation names it.  Catalog reads: never with claims.lock held,
 * never at the transaction's end (Pending keeps what was read).
 */
Oid
idem_outbox_install(void)
{
	Oid			nsp;

	if (OidIsValid(gen_relid))
		return gen_relid;
	idem_relcache_watch();
	nsp = get_namespace_oid("idempotency", true);
	if (OidIsValid(nsp))
		gen_relid = get_relname_relid("outbox_message_id_seq", nsp);
	return gen_relid;
}

static void
claims_relcache(Oid relid)
{
	if (!OidIsValid(relid) || relid == gen_relid)
		gen_relid = InvalidOid;
}

static inline ClaimKey
claim_key_of(Oid gen, int64 id)
{
	ClaimKey	k;

	memset(&k, 0, sizeof(k));
	k.db = MyDatabaseId;
	k.gen = gen;
	k.id = id;
	return k;
}

static inline ClaimKey
claim_key(int64 id)
{
	return claim_key_of(idem_outbox_install(), id);
}

/*
 * Did the transaction that made an entry abort?  Only a prepared one can
 * have (ROLLBACK PREPARED runs no callback of the backend that claimed); an
 * entry of a transaction that aborted here is removed at its abort.
 */
static bool
claim_aborted(TransactionId xid)
{
	return TransactionIdIsValid(xid) && !TransactionIdIsInProgress(xid) &&
		!TransactionIdDidCommit(xid);
}

/*
 * The same, with the exclusive lock held: an entry whose prepared
 * transaction is seen committed forgets its xid, so that its status is
 * never looked up again (an entry can outlive its transaction by a long
 * time, and the commit log that holds the status is truncated in the end);
 * one whose prepared transaction rolled back becomes the lapsed claim it
 * took over, if any.  Returns whether it aborted with nothing to put back
 * (the caller treats it as never made).
 */
static bool
claim_resolve(ClaimEntry *e)
{
	if (!TransactionIdIsValid(e->xid) || TransactionIdIsInProgress(e->xid))
		return false;
	if (!TransactionIdDidCommit(e->xid) && e->prior_attempt == 0)
		return true;
	if (!TransactionIdDidCommit(e->xid))
	{
		e->token = e->prior_token;
		e->until = e->prior_until;
		e->attempt = e->prior_attempt;
	}
	e->xid = InvalidTransactionId;
	e->prior_attempt = 0;
	return false;
}

/* ---------------------------------------------------------------------
 * At the transaction's end
 * ---------------------------------------------------------------------
 */
static void
claims_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	ListCell   *lc;

	if (pending == NIL)
		return;
	if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT &&
		event != XACT_EVENT_PREPARE && event != XACT_EVENT_PARALLEL_COMMIT &&
		event != XACT_EVENT_PARALLEL_ABORT)
		return;

	/*
	 * prepared: its claims stay, their xid set (claim_aborted(): ROLLBACK
	 * PREPARED undoes them); what its acks end lapses (documented)
	 */
	if (event != XACT_EVENT_PREPARE && claims.hash != NULL)
	{
		bool		commit = event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT;

		LWLockAcquire(claims.lock, LW_EXCLUSIVE);
		foreach(lc, pending)
		{
			Pending    *p = (Pending *) lfirst(lc);
			ClaimKey	k = claim_key_of(p->gen, p->id);
			ClaimEntry *e;

			if (p->kind != PENDING_MADE && !commit)
				continue;
			e = (ClaimEntry *) hash_search(claims.hash, &k, HASH_FIND, NULL);
			if (e == NULL || memcmp(&e->token, &p->token, sizeof(pg_uuid_t)) != 0)
				continue;
			if (p->kind == PENDING_MADE && !commit && p->took_over)
			{
				*e = p->before; /* the lapsed claim, its attempt counted */
				continue;
			}
			if (p->kind == PENDING_MADE && commit)
			{
				e->xid = InvalidTransactionId;	/* committed: no need to ask */
				e->prior_attempt = 0;
				continue;
			}
			hash_search(claims.hash, &k, HASH_REMOVE, NULL);
		}
		LWLockRelease(claims.lock);
	}
	pending = NIL;				/* its memory goes with TopTransactionContext */
}

/*
 * A subtransaction's pending ends go with its abort (and the
 * claims it made end at once: its row locks are gone); on commit they
 * pass to its parent.
 */
static void
claims_subxact_callback(SubXactEvent event, SubTransactionId mySubid pg_attribute_unused(),
						SubTransactionId parentSubid pg_attribute_unused(),
						void *arg pg_attribute_unused())
{
	int			level = GetCurrentTransactionNestLevel();
	List	   *kept = NIL;
	ListCell   *lc;
	MemoryContext old;

	if (pending == NIL ||
		(event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB))
		return;
	old = MemoryContextSwitchTo(TopTransactionContext);
	if (event == SUBXACT_EVENT_ABORT_SUB && claims.hash != NULL)
		LWLockAcquire(claims.lock, LW_EXCLUSIVE);
	foreach(lc, pending)
	{
		Pending    *p = (Pending *) lfirst(lc);

		if (p->level >= level)
		{
			if (event == SUBXACT_EVENT_COMMIT_SUB)
				p->level = level - 1;
			else
			{
				if (p->kind == PENDING_MADE && claims.hash != NULL)
				{
					ClaimKey	k = claim_key_of(p->gen, p->id);
					ClaimEntry *e = (ClaimEntry *) hash_search(claims.hash, &k, HASH_FIND, NULL);

					if (e != NULL && memcmp(&e->token, &p->token, sizeof(pg_uuid_t)) == 0)
					{
						if (p->took_over)
							*e = p->before;
						else
							hash_search(claims.hash, &k, HASH_REMOVE, NULL);
					}
				}
				continue;
			}
		}
		kept = lappend(kept, p);
	}
	if (event == SUBXACT_EVENT_ABORT_SUB && claims.hash != NULL)
		LWLockRelease(claims.lock);
	MemoryContextSwitchTo(old);
	pending = kept;
}

static void
pending_add(PendingKind kind, int64 id, const pg_uuid_t *token, int32 topic_id)
{
	MemoryContext old;
	Pending    *p;
	Oid			gen = idem_outbox_install();

	if (!callback_registered)
	{
		RegisterXactCallback(claims_xact_callback, NULL);
		RegisterSubXactCallback(claims_subxact_callback, NULL);
		callback_registered = true;
	}
	old = MemoryContextSwitchTo(TopTransactionContext);
	p = palloc0(sizeof(Pending));
	p->kind = kind;
	p->gen = gen;
	p->id = id;
	if (token)
		p->token = *token;
	p->topic_id = topic_id;
	p->level = GetCurrentTransactionNestLevel();
	pending = lappend(pending, p);
	MemoryContextSwitchTo(old);
}

/* ---------------------------------------------------------------------
 * For outbox_relay.c and lifecycle.c
 * ---------------------------------------------------------------------
 */

/*
 * Drop the lapsed entries, and those of this database's earlier installs
 * (not gen: one whose DROP EXTENSION was prepared, so that owners.c did not
 * free them at its commit), exclusive lock held; how many
 */
static int
claims_sweep(TimestampTz now, Oid gen)
{
	HASH_SEQ_STATUS seq;
	ClaimEntry *e;
	int			n = 0;

	hash_seq_init(&seq, claims.hash);
	while ((e = (ClaimEntry *) hash_seq_search(&seq)) != NULL)
	{
		bool		aborted = claim_resolve(e);
		bool		gone = OidIsValid(gen) && e->key.db == MyDatabaseId &&
			e->key.gen != gen;

		if (!aborted && !gone && e->until > now)
			continue;
		hash_search(claims.hash, &e->key, HASH_REMOVE, NULL);
		n++;
	}
	return n;
}

/*
 * Is there room for one more entry (exclusive lock held)?  The table is a
 * shared dynahash: HASH_ENTER_NULL fails only when the whole shared memory
 * segment is used up, not at its max_size, so the entries are counted
 * here; a full table drops its lapsed entries first.  (Growing past
 * max_size took the spare memory the lock table grows into: 53200 for
 * every session of the cluster.)
 */
static bool
claims_room(TimestampTz now, Oid gen)
{
	if (hash_get_num_entries(claims.hash) < idem_outbox_claims_max)
		return true;
	return claims_sweep(now, gen) > 0;
}

/*
 * Free the entries of database db and install gen (InvalidOid: of every
 * install): owners.c, when a database or an install is gone.
 */
void
idem_outbox_claims_forget(Oid db, Oid gen)
{
	idem_sharedhash_forget(&claims, db, gen);
}

/*
 * Free the entries of topic topic_id of database db and install gen:
 * owners.c, at the commit of the topic's drop (its messages are deleted).
 */
void
idem_outbox_claims_forget_topic(Oid db, Oid gen, int32 topic_id)
{
	HASH_SEQ_STATUS seq;
	ClaimEntry *e;

	if (claims.hash == NULL)
		return;
	LWLockAcquire(claims.lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, claims.hash);
	while ((e = (ClaimEntry *) hash_seq_search(&seq)) != NULL)
		if (e->key.db == db && e->key.gen == gen && e->topic_id == topic_id)
			hash_search(claims.hash, &e->key, HASH_REMOVE, NULL);
	LWLockRelease(claims.lock);
}

/*
 * Claim message id (its row locked by this transaction) for token until
 * until: CLAIM_NEW (*lapsed = -1), CLAIM_LAPSED (a lapsed claim taken over:
 * *lapsed its attempt, the new one is *lapsed + 1), CLAIM_BUSY (claimed by
 * another claim, not lapsed) or CLAIM_FULL.  row_attempts: the row's.
 * With *lapsed >= max_attempts the entry is removed instead (the caller
 * makes the message dead).
 */
int
idem_outbox_claim_enter(int64 id, int32 topic_id, const pg_uuid_t *token,
						TimestampTz until, TimestampTz now, int32 row_attempts,
						int32 max_attempts, int32 *lapsed)
{
	ClaimKey	k = claim_key(id);
	ClaimEntry *e;
	ClaimEntry	before;
	bool		found;
	int			result;

	*lapsed = -1;
	LWLockAcquire(claims.lock, LW_EXCLUSIVE);
	e = (ClaimEntry *) hash_search(claims.hash, &k, HASH_FIND, NULL);
	found = e != NULL;
	if (e != NULL && claim_resolve(e))
		found = false;			/* rolled back after PREPARE: as if never made */
	if (e == NULL && claims_room(now, k.gen))
		e = (ClaimEntry *) hash_search(claims.hash, &k, HASH_ENTER_NULL, &found);
	if (e == NULL)
	{
		LWLockRelease(claims.lock);
		return CLAIM_FULL;
	}
	if (found && e->until > now)
	{
		LWLockRelease(claims.lock);
		return CLAIM_BUSY;
	}
	if (found)
		before = *e;
	if (found)
	{
		*lapsed = Max(e->attempt, row_attempts);
		if (*lapsed >= max_attempts)
		{
			hash_search(claims.hash, &k, HASH_REMOVE, NULL);
			LWLockRelease(claims.lock);
			return CLAIM_LAPSED;
		}
		e->attempt = *lapsed + 1;
		e->prior_token = before.token;
		e->prior_until = before.until;
		e->prior_attempt = before.attempt;
		result = CLAIM_LAPSED;
	}
	else
	{
		e->attempt = row_attempts + 1;
		e->prior_attempt = 0;
		result = CLAIM_NEW;
	}
	e->token = *token;
	e->until = until;
	e->topic_id = topic_id;
	e->xid = GetTopTransactionIdIfAny();	/* assigned: the rows are locked */
	LWLockRelease(claims.lock);
	pending_add(PENDING_MADE, id, token, topic_id);
	if (result == CLAIM_LAPSED)
	{
		/* an abort puts the lapsed claim back, so its attempt still counts */
		Pending    *p = (Pending *) llast(pending);

		p->took_over = true;
		p->before = before;
		p->before.xid = InvalidTransactionId;	/* it lapsed: nothing to ask */
		p->before.prior_attempt = 0;
	}
	return result;
}

/* ack/nack/release of id by token: the entry ends when this transaction commits */
void
idem_outbox_claim_end(int64 id, const pg_uuid_t *token)
{
	pending_add(PENDING_END, id, token, 0);
}

/* the databases that have entries here, up to max of them into dbs; how many */
int
idem_outbox_claims_databases(Oid *dbs, int max)
{
	return idem_sharedhash_databases(&claims, dbs, max);
}

/* ---------------------------------------------------------------------
 * For the SQL-callable readers (outbox_inflight.c)
 * ---------------------------------------------------------------------
 */

/*
 * The claim in shared memory that holds id, lapsed or not, into *out; false
 * when there is none (or its prepared transaction rolled back, taking over
 * no lapsed claim).
 */
bool
idem_outbox_claim_read(int64 id, IdemOutboxClaim *out)
{
	ClaimKey	k;
	ClaimEntry *e;
	bool		found = false;
	TransactionId xid = InvalidTransactionId;

	if (claims.hash == NULL)
		return false;
	k = claim_key(id);
	LWLockAcquire(claims.lock, LW_SHARED);
	e = (ClaimEntry *) hash_search(claims.hash, &k, HASH_FIND, NULL);
	if (e != NULL)
	{
		out->token = e->token;
		out->until = e->until;
		out->attempt = e->attempt;
		out->topic_id = e->topic_id;
		xid = e->xid;
		found = true;
		/* rolled back after PREPARE: the lapsed claim it took over, if any */
		if (e->prior_attempt > 0 && claim_aborted(xid))
		{
			out->token = e->prior_token;
			out->until = e->prior_until;
			out->attempt = e->prior_attempt;
			xid = InvalidTransactionId;
		}
	}
	LWLockRelease(claims.lock);
	return found && !claim_aborted(xid);
}
