/*-------------------------------------------------------------------------
 *
 * outbox_claims.c
 *	  Where an outbox claim lives (outbox_claims.h): in shared memory when
 *	  the library is preloaded (a claim writes no row version), and what
 *	  claim() does there: the window of ready messages scanned in C, each
 *	  locked message entered, lapsed claims taken over; the SQL-callable
 *	  readers of the claims.
 *
 * Two places, because two kinds of users need them.  Preloaded, claim()
 * (outbox_relay.c) locks the messages it hands out FOR UPDATE SKIP LOCKED
 * for its statement's transaction and enters each one here: (database,
 * install, message id) -> claim token, claimed until, attempt (the install:
 * see ClaimKey).  The row stays as it is ('pending', available_at
 * unchanged), so a claim costs a row lock, not a row version; ack() deletes
 * the row.  Without preloading (the README's "Preloading": the functions
 * need no shared_preload_libraries), and between a new library and ALTER
 * EXTENSION UPDATE of a database whose SQL objects cannot read these
 * entries (idem_outbox_claims_shared()), the claim is written into the row
 * by outbox_relay.c's statements: the portable edition, which has no shared
 * memory, claims that way too.  ack, nack and release accept a claim of
 * either kind, by its token.
 *
 * Each entry ends when the transaction of the ack, nack or release that
 * names it commits (idem_outbox_claims_end()); a claim whose transaction
 * aborts removes the entries it made.  What the entries give the SQL
 * statements:
 *
 *	idempotency._outbox_claimed(id)			claimed, and its claim not lapsed?
 *	idempotency._outbox_attempt(id, claim)	the claim's attempt, NULL if id
 *											is not held by that claim
 *	idempotency._outbox_claim(id)			the claim that holds id
 *
 * A lapsed entry stays until another claim takes the message over (then
 * that claim writes the lapsed attempt into the row: lapsed_write()) or
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
 * The window in C (idem_outbox_claim_scan()) is the claim statement's
 * window (outbox_relay.c, CLAIM_WINDOW) done as an index scan of
 * outbox_message_ready_idx in (available_at, id) order with the
 * statement's rules, for the shipped shape of the table and its two
 * indexes; anything else runs the statement (idem_outbox_claim_run_shared()).
 * Why (the statement was two thirds of a claim + ack) and each rule:
 * src/README.md, "claim()'s window in C".  The acked counts are
 * outbox_counts.c's.
 *
 * Locking: claims.lock (an LWLock) guards the hash table: shared to look
 * up, exclusive to add, change or remove an entry; nothing waits, and no
 * SQL runs, while holding it.  The window: RowShareLock on outbox_message
 * (held to the transaction's end, as SELECT FOR UPDATE), AccessShareLock
 * on its two indexes; row locks (exclusive, as FOR UPDATE) on the messages
 * claimed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/itup.h"
#include "access/relation.h"
#include "access/relscan.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "compat.h"
#include "idempotency.h"
#include "outbox_claims.h"

#define CLAIMS_TRANCHE "idempotency outbox claims"

/* what claim_enter() found */
#define CLAIM_NEW 0
#define CLAIM_LAPSED 1
#define CLAIM_BUSY 2
#define CLAIM_FULL 3
#define CLAIM_SHARE 4			/* the topic's owner holds its share */

/* a claim in shared memory, as claim_read() copies it */
typedef struct IdemOutboxClaim
{
	pg_uuid_t	token;
	TimestampTz until;
	int32		attempt;
	int32		topic_id;
} IdemOutboxClaim;

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
	Oid			owner;			/* the topic's owner (IdemClaimShare) */
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

static int	claims_max = 65536;
bool		idem_outbox_claims_on = false;

/*
 * Beside the table in shared memory (claims.lock guards it): how many times
 * an entry was made a live claim (entered, or a lapsed one taken over), so
 * that a claim() call knows whether other calls made any since it counted
 * its role's share (share_room())
 */
typedef struct ClaimsShared
{
	uint64		made;
} ClaimsShared;

static ClaimsShared *claims_shared = NULL;

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
	idem_sharedhash_request(&claims, claims_max);
	RequestAddinShmemSpace(MAXALIGN(sizeof(ClaimsShared)));
}

static void
claims_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	(void) idem_sharedhash_attach(&claims, claims_max);
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	claims_shared = ShmemInitStruct("idempotency outbox claims made",
									sizeof(ClaimsShared), &found);
	if (!found)
		claims_shared->made = 0;
	LWLockRelease(AddinShmemInitLock);
	idem_outbox_claims_on = claims.hash != NULL;
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
							&claims_max,
							65536, 64, INT_MAX / 64,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
	idem_request_shmem(claims_shmem_request);
	idem_relcache_add(claims_relcache);
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = claims_shmem_startup;
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
 * Entering and ending claims; for owners.c
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
	if (hash_get_num_entries(claims.hash) < claims_max)
		return true;
	return claims_sweep(now, gen) > 0;
}

/*
 * May the role of share enter one more claim (exclusive lock held)?
 * Nothing is counted while less than half the table is in use; from then
 * on a role whose topics hold an eighth of it enters no more, so that it
 * takes at least five roles to fill the table (as outbox_counts.c gives a
 * role at most an eighth of its table); a superuser's topics are not
 * limited.  Only the claims that hold their messages at now count: a
 * lapsed one, or one whose prepared transaction rolled back, keeps its
 * place only until a full table sweeps it (claims_room()), so it denies
 * no other role; counted, a role whose relay crashed could claim none of
 * its other topics until other roles filled the table.
 *
 * A scan walks every bucket: the call counts once, then adds the claims it
 * makes.  Claims other calls made since (claims_shared->made) may be the
 * role's too (its other relays, claiming at the same moment): while they
 * could take it to its eighth, the call counts again, once; after that it
 * enters no more (its next call counts afresh).  So the role never holds
 * more than its eighth, at two scans per call at most.
 */
static bool
share_room(IdemClaimShare *share, TimestampTz now)
{
	HASH_SEQ_STATUS seq;
	ClaimEntry *e;

	if (!share->limited)
		return true;
	if (share->held < 0 && hash_get_num_entries(claims.hash) < claims_max / 2)
		return true;
	if (share->held >= 0 &&
		share->held + (claims_shared->made - share->made) < (uint64) (claims_max / 8))
		return true;
	if (share->held >= 0 &&
		(share->made == claims_shared->made || share->counted >= 2))
		return false;
	share->held = 0;
	share->made = claims_shared->made;
	share->counted++;
	hash_seq_init(&seq, claims.hash);
	while ((e = (ClaimEntry *) hash_seq_search(&seq)) != NULL)
		if (e->owner == share->owner && e->until > now &&
			!claim_resolve(e) && e->until > now)
			share->held++;		/* (an abort puts back a lapsed claim) */
	return share->held < claims_max / 8;
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
 * another claim, not lapsed), CLAIM_FULL or CLAIM_SHARE (a new entry, and
 * no room for it in the table or in share).  row_attempts: the row's.
 * With *lapsed >= max_attempts the entry is removed instead (the caller
 * makes the message dead).
 */
static int
claim_enter(int64 id, int32 topic_id, const pg_uuid_t *token,
			TimestampTz until, TimestampTz now, int32 row_attempts,
			int32 max_attempts, IdemClaimShare *share, int32 *lapsed)
{
	ClaimKey	k = claim_key(id);
	ClaimEntry *e;
	ClaimEntry	before;
	bool		found;
	bool		entered = false;
	int			result;

	*lapsed = -1;
	LWLockAcquire(claims.lock, LW_EXCLUSIVE);
	e = (ClaimEntry *) hash_search(claims.hash, &k, HASH_FIND, NULL);
	found = e != NULL;
	if (e != NULL && claim_resolve(e))
		found = false;			/* rolled back after PREPARE: as if never made */
	if (e == NULL)
	{
		if (!claims_room(now, k.gen))
			result = CLAIM_FULL;
		else if (!share_room(share, now))
			result = CLAIM_SHARE;
		else
		{
			e = (ClaimEntry *) hash_search(claims.hash, &k, HASH_ENTER_NULL, &found);
			entered = e != NULL;
			result = CLAIM_FULL;
		}
		if (e == NULL)
		{
			LWLockRelease(claims.lock);
			return result;
		}
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
	}

	/*
	 * A lapsed claim taken over (or a place left by a rollback) holds its
	 * message again: within the share too, which counted it no more
	 */
	if (!entered && !share_room(share, now))
	{
		LWLockRelease(claims.lock);
		*lapsed = -1;
		return CLAIM_SHARE;
	}
	if (found)
	{
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
	e->owner = share->owner;
	claims_shared->made++;
	if (share->held >= 0)
	{
		share->held++;			/* new or taken over: share_room() counted
								 * neither */
		share->made++;
	}
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

/* the databases that have entries here, up to max of them into dbs; how many */
int
idem_outbox_claims_databases(Oid *dbs, int max)
{
	return idem_sharedhash_databases(&claims, dbs, max);
}

/* ---------------------------------------------------------------------
 * Reading a claim
 * ---------------------------------------------------------------------
 */

/*
 * The claim in shared memory that holds id, lapsed or not, into *out; false
 * when there is none (or its prepared transaction rolled back, taking over
 * no lapsed claim).
 */
static bool
claim_read(int64 id, IdemOutboxClaim *out)
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

/*
 * The messages ids[0..n-1] of claim token that an ack, nack or release
 * changed (attempts: their rows' attempts; durable: the row carried the
 * claim itself): each one's entry ends when this transaction commits,
 * except for an ack's durable claims, which have none.  For an ack (ack),
 * returns the messages' retries (their attempts after the first, the
 * entry's attempt where it holds the message).  *gen: the install the
 * entries belong to (for the acked counts).
 */
int64
idem_outbox_claims_end(const pg_uuid_t *token, int n, const int64 *ids,
					   const int32 *attempts, const bool *durable, bool ack,
					   Oid *gen)
{
	int64		retried = 0;

	*gen = idem_outbox_install();

	for (int i = 0; i < n; i++)
	{
		int32		attempt = attempts[i];

		if (ack && !durable[i])
		{
			IdemOutboxClaim c;	/* the attempt is the entry's */

			if (claim_read(ids[i], &c) &&
				memcmp(&c.token, token, sizeof(pg_uuid_t)) == 0)
				attempt = c.attempt;
		}
		if (ack)
			retried += Max(attempt - 1, 0);
		if (!(ack && durable[i]))
			pending_add(PENDING_END, ids[i], token, 0);
	}
	return retried;
}

/* ---------------------------------------------------------------------
 * The SQL-callable readers: for the claim statements (outbox_relay.c) and
 * the view outbox_in_flight
 * ---------------------------------------------------------------------
 */

/*
 * May the caller see topic_id's claims and counts (outbox_counts.c)?  A
 * role in pg_read_all_stats sees every topic (as outbox_stats shows them);
 * others, the topics they see in outbox_topic (its row-level security:
 * owned or granted).
 */
bool
idem_outbox_topic_visible(int32 topic_id)
{
	Oid			types[1] = {INT4OID};
	Datum		values[1];
	bool		visible;

	if (has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_STATS))
		return true;
	values[0] = Int32GetDatum(topic_id);
	SPI_connect();
	if (SPI_execute_with_args("SELECT 1 FROM idempotency.outbox_topic AS t"
							  " WHERE t.id OPERATOR(pg_catalog.=) $1",
							  1, types, values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read idempotency.outbox_topic");
	visible = SPI_processed > 0;
	SPI_finish();
	return visible;
}

/* _outbox_claimed(id) -> is id claimed, its claim not lapsed? */
PG_FUNCTION_INFO_V1(idempotency_outbox_claimed);

Datum
idempotency_outbox_claimed(PG_FUNCTION_ARGS)
{
	IdemOutboxClaim c;

	PG_RETURN_BOOL(claim_read(PG_GETARG_INT64(0), &c) &&
				   c.until > GetCurrentTimestamp());
}

/* _outbox_attempt(id, claim) -> the claim's attempt of id, NULL unless it holds id */
PG_FUNCTION_INFO_V1(idempotency_outbox_attempt);

Datum
idempotency_outbox_attempt(PG_FUNCTION_ARGS)
{
	IdemOutboxClaim c;
	pg_uuid_t  *token = PG_GETARG_UUID_P(1);

	if (!claim_read(PG_GETARG_INT64(0), &c) ||
		memcmp(&c.token, token, sizeof(pg_uuid_t)) != 0)
		PG_RETURN_NULL();
	PG_RETURN_INT32(c.attempt);
}

/*
 * _outbox_claim(id) -> (claim, claimed_until, attempt) of the claim in
 * shared memory that holds id, lapsed or not (NULLs: none); for the view
 * outbox_in_flight.  A token alone lets nobody ack: ack() also checks the
 * caller's right to consume the message's topic; still, it is shown only
 * to whom the topic is visible (as _outbox_counts), not to any caller who
 * guesses message ids.
 */
PG_FUNCTION_INFO_V1(idempotency_outbox_claim);

Datum
idempotency_outbox_claim(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	IdemOutboxClaim c;
	Datum		values[3] = {0, 0, 0};
	bool		nulls[3] = {true, true, true};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "_outbox_claim must return a row");
	/* another role's message: nothing (the function takes any id) */
	if (claim_read(PG_GETARG_INT64(0), &c) && idem_outbox_topic_visible(c.topic_id))
	{
		pg_uuid_t  *token = palloc(sizeof(pg_uuid_t));

		*token = c.token;
		values[0] = UUIDPGetDatum(token);
		values[1] = TimestampTzGetDatum(c.until);
		values[2] = Int32GetDatum(c.attempt);
		nulls[0] = nulls[1] = nulls[2] = false;
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* ---------------------------------------------------------------------
 * What a claim does with a message it locked
 * ---------------------------------------------------------------------
 */
#define TAKE_CLAIMED 0
#define TAKE_DEAD 1				/* a lapsed claim at max_attempts */
#define TAKE_BUSY 2				/* another claim holds it */
#define TAKE_FULL 3				/* no room in shared memory, or in the share */

/* lapsed claims taken over: their attempts go into the rows */
typedef struct Lapsed
{
	int			n;
	int			ndead;
	Datum	   *ids;
	Datum	   *attempts;
	Datum	   *dead;
} Lapsed;

static void
lapsed_init(Lapsed *l, int size)
{
	l->n = l->ndead = 0;
	l->ids = palloc(size * sizeof(Datum));
	l->attempts = palloc(size * sizeof(Datum));
	l->dead = palloc(size * sizeof(Datum));
}

/*
 * Message id (its row locked by this transaction; row_attempts its
 * attempts, durable: the row carries a claim of its own, which lapsed) for
 * the claim in values ($3 token, $4 until, $5 now, $6 max_attempts, $1
 * topic): enter it in shared memory, within share.  *attempt: the
 * claim's attempt.
 */
static int
claim_take(int64 id, int32 row_attempts, bool durable, Datum *values,
		   IdemClaimShare *share, Lapsed *l, int32 *attempt)
{
	int32		topic_id = DatumGetInt32(values[0]);
	pg_uuid_t  *token = DatumGetUUIDP(values[2]);
	TimestampTz until = DatumGetTimestampTz(values[3]);
	TimestampTz now = DatumGetTimestampTz(values[4]);
	int32		max_attempts = DatumGetInt32(values[5]);
	int32		lapsed;
	int			r;

	if (durable && row_attempts >= max_attempts)
	{
		/* a durable claim lapsed at max_attempts: dead */
		r = CLAIM_LAPSED;
		lapsed = row_attempts;
	}
	else
	{
		r = claim_enter(id, topic_id, token, until, now,
						row_attempts, max_attempts, share, &lapsed);
		if (r == CLAIM_NEW && durable)
		{
			r = CLAIM_LAPSED;	/* its attempt is in the row already */
			lapsed = row_attempts;
		}
	}
	if (r == CLAIM_BUSY)
		return TAKE_BUSY;
	if (r == CLAIM_FULL)
	{
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("idempotency.outbox_claims (%d) messages are claimed: claim() hands out fewer",
						claims_max),
				 errhint("Raise idempotency.outbox_claims (a restart is needed) or claim smaller batches.")));
		return TAKE_FULL;
	}
	if (r == CLAIM_SHARE)
	{
		char	   *role = GetUserNameFromId(share->owner, true);

		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("the topics of role \"%s\" hold an eighth of idempotency.outbox_claims (%d): claim() hands out fewer",
						role ? role : "?", claims_max),
				 errdetail("Once half the table is in use, no role's topics take more than an eighth of it, so that other roles can still claim."),
				 errhint("Ack, nack or release claims, claim with a shorter visibility, or raise idempotency.outbox_claims (a restart is needed).")));
		return TAKE_FULL;
	}
	if (r == CLAIM_LAPSED)
	{
		l->ids[l->n] = Int64GetDatum(id);
		l->attempts[l->n] = Int32GetDatum(lapsed);
		l->dead[l->n] = BoolGetDatum(lapsed >= max_attempts);
		l->n++;
		if (lapsed >= max_attempts)
		{
			l->ndead++;
			return TAKE_DEAD;
		}
	}
	*attempt = r == CLAIM_LAPSED ? lapsed + 1 : row_attempts + 1;
	return TAKE_CLAIMED;
}

/*
 * A claim that took over lapsed claims writes their attempts into the rows
 * (so a crash loses at most the attempt in flight), and makes those at
 * max_attempts dead.
 */
static SPIPlanPtr plan_claim_lapsed = NULL;

static void
lapsed_write(Lapsed *l)
{
	Oid			ltypes[3] = {INT8ARRAYOID, INT4ARRAYOID, BOOLARRAYOID};
	Datum		lvalues[3];

	if (l->n == 0)
		return;
	lvalues[0] = PointerGetDatum(construct_array(l->ids, l->n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	lvalues[1] = PointerGetDatum(construct_array(l->attempts, l->n, INT4OID, 4, true, TYPALIGN_INT));
	lvalues[2] = PointerGetDatum(construct_array(l->dead, l->n, BOOLOID, 1, true, TYPALIGN_CHAR));
	idem_run_as_owner(&plan_claim_lapsed,
					  "UPDATE idempotency.outbox_message AS m"
					  "   SET attempts = l.attempts, claim = NULL,"
					  "       state = CASE WHEN l.dead THEN 'dead' ELSE 'pending' END,"
					  "       last_error = '{\"error\": \"visibility timeout: the claim lapsed without ack or nack\"}'::pg_catalog.jsonb"
					  "  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))"
					  "       AS l(id, attempts, dead)"
					  " WHERE m.id OPERATOR(pg_catalog.=) l.id"
					  "   AND m.state OPERATOR(pg_catalog.=) 'pending'",
					  3, ltypes, lvalues, NULL, SPI_OK_UPDATE);
}

/*
 * Run a claim statement of outbox_relay.c (the window's when the table is
 * not of the shipped shape, and beyond the window) (it locks the candidates and
 * returns the outbox_claim columns, then whether the row carries a durable
 * claim) for up to remaining messages: each locked row is entered in
 * shared memory (claim_take()), and the statement runs again as long as
 * some of those it took went dead and fewer than remaining were claimed
 * (each run turns at least one message dead, so this ends).  Returns how
 * many were claimed.  Inside SPI_connect().
 */
int32
idem_outbox_claim_run_shared(SPIPlanPtr *plan, const char *sql, Oid *argtypes,
							 Datum *values, int32 remaining, ReturnSetInfo *rsinfo,
							 IdemClaimShare *share)
{
	int32		claimed = 0;

	for (;;)
	{
		uint64		n;
		uint64		i;
		Lapsed		l;
		bool		full = false;

		values[1] = Int32GetDatum(remaining - claimed);
		n = idem_run_as_owner(plan, sql, 8, argtypes, values, NULL, SPI_OK_SELECT);
		if (n == 0)
			return claimed;
		lapsed_init(&l, (int) n);
		for (i = 0; i < n && !full; i++)
		{
			Datum		cols[11];
			bool		nulls[11];
			int32		attempt;

			heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, cols, nulls);
			switch (claim_take(DatumGetInt64(cols[0]), DatumGetInt32(cols[6]),
							   DatumGetBool(cols[10]), values, share, &l, &attempt))
			{
				case TAKE_CLAIMED:
					cols[6] = Int32GetDatum(attempt);
					tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, cols, nulls);
					claimed++;
					break;
				case TAKE_FULL:
					full = true;
					break;
				default:
					break;
			}
		}
		lapsed_write(&l);
		if (l.ndead == 0 || claimed >= remaining || full)
			return claimed;
	}
}

/* ---------------------------------------------------------------------
 * The window, scanned in C
 * ---------------------------------------------------------------------
 */

/* the columns the scan reads, and the two indexes */
enum
{
	M_ID, M_TOPIC, M_MESSAGE_ID, M_KEY, M_PAYLOAD, M_HEADERS, M_STATE,
	M_ATTEMPTS, M_AVAILABLE, M_CLAIM, M_PUBLISHED, M_NCOLS
};

static const struct
{
	const char *name;
	Oid			type;
}			msg_cols[M_NCOLS] = {
	{"id", INT8OID}, {"topic_id", INT4OID}, {"message_id", UUIDOID},
	{"message_key", TEXTOID}, {"payload", JSONBOID}, {"headers", JSONBOID},
	{"state", TEXTOID}, {"attempts", INT4OID}, {"available_at", TIMESTAMPTZOID},
	{"claim", UUIDOID}, {"published_at", TIMESTAMPTZOID}
};

typedef struct Window
{
	Relation	heap;
	Relation	ready;			/* (topic_id, available_at, id) WHERE pending */
	Relation	keys;			/* (topic_id, message_key, id) WHERE pending
								 * AND message_key IS NOT NULL */
	AttrNumber	att[M_NCOLS];
	IndexScanDesc keyscan;		/* the key-head probe: begun on first use in a
								 * pass, ended with it */
	TupleTableSlot *keyslot;
} Window;

/* a btree index over exactly the columns a, b, c of the heap, valid and partial */
static bool
index_shape(Relation index, AttrNumber a, AttrNumber b, AttrNumber c)
{
	Form_pg_index ix = index->rd_index;

	return index->rd_rel->relam == BTREE_AM_OID && ix->indisvalid &&
		ix->indnkeyatts == 3 && ix->indnatts == 3 &&
		ix->indkey.values[0] == a && ix->indkey.values[1] == b &&
		ix->indkey.values[2] == c &&
		!heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL) &&
		RelationGetIndexExpressions(index) == NIL;
}

static Relation
open_index(Oid nsp, const char *name, Relation heap)
{
	Oid			relid = get_relname_relid(name, nsp);
	Relation	index;

	if (!OidIsValid(relid))
		return NULL;
	index = index_open(relid, AccessShareLock);
	if (index->rd_index->indrelid != RelationGetRelid(heap))
	{
		index_close(index, AccessShareLock);
		return NULL;
	}
	return index;
}

/*
 * Open outbox_message and its two indexes; false (nothing held open) when
 * the table is not of the shipped shape.
 */
static bool
window_open(Window *w)
{
	Oid			nsp = get_namespace_oid("idempotency", false);
	Oid			relid;
	TupleDesc	desc;

	memset(w, 0, sizeof(*w));
	relid = RangeVarGetRelid(makeRangeVar("idempotency", "outbox_message", -1),
							 RowShareLock, false);
	w->heap = table_open(relid, NoLock);
	desc = RelationGetDescr(w->heap);
	for (int c = 0; c < M_NCOLS; c++)
	{
		w->att[c] = InvalidAttrNumber;
		for (int i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute a = TupleDescAttr(desc, i);

			if (!a->attisdropped && strcmp(NameStr(a->attname), msg_cols[c].name) == 0 &&
				a->atttypid == msg_cols[c].type)
				w->att[c] = a->attnum;
		}
		if (w->att[c] == InvalidAttrNumber)
			goto no;
	}
	if (w->heap->rd_rel->relkind != RELKIND_RELATION)
		goto no;
	w->ready = open_index(nsp, "outbox_message_ready_idx", w->heap);
	w->keys = open_index(nsp, "outbox_message_key_idx", w->heap);
	if (w->ready != NULL && w->keys != NULL &&
		index_shape(w->ready, w->att[M_TOPIC], w->att[M_AVAILABLE], w->att[M_ID]) &&
		index_shape(w->keys, w->att[M_TOPIC], w->att[M_KEY], w->att[M_ID]))
		return true;
no:
	if (w->ready != NULL)
		index_close(w->ready, AccessShareLock);
	if (w->keys != NULL)
		index_close(w->keys, AccessShareLock);
	table_close(w->heap, NoLock);	/* the lock stays, as a statement's would */
	return false;
}

static void
window_close(Window *w)
{
	index_close(w->ready, NoLock);
	index_close(w->keys, NoLock);
	table_close(w->heap, NoLock);
}

/* does the message id of key head its key (no pending message of the key before it)? */
static bool
key_head(Window *w, Snapshot snap, int32 topic_id, Datum key, int64 id)
{
	ScanKeyData skey[3];
	bool		before = false;

	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(topic_id));
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   w->keys->rd_indcollation[1], F_TEXTEQ, key);
	ScanKeyInit(&skey[2], 3, BTLessStrategyNumber, F_INT8LT, Int64GetDatum(id));
	if (w->keyscan == NULL)
	{
		w->keyscan = IDEM_INDEX_BEGINSCAN(w->heap, w->keys, snap, 3, 0);
		w->keyslot = table_slot_create(w->heap, NULL);
	}
	index_rescan(w->keyscan, skey, 3, NULL, 0);
	while (index_getnext_slot(w->keyscan, ForwardScanDirection, w->keyslot))
	{
		bool		isnull;
		text	   *state = DatumGetTextPP(slot_getattr(w->keyslot, w->att[M_STATE], &isnull));

		if (VARSIZE_ANY_EXHDR(state) == 7 && memcmp(VARDATA_ANY(state), "pending", 7) == 0)
		{
			before = true;
			break;
		}
	}
	return !before;
}

static bool
is_pending(TupleTableSlot *slot, Window *w)
{
	bool		isnull;
	text	   *state = DatumGetTextPP(slot_getattr(slot, w->att[M_STATE], &isnull));

	return !isnull && VARSIZE_ANY_EXHDR(state) == 7 &&
		memcmp(VARDATA_ANY(state), "pending", 7) == 0;
}

/* a message claimed: its row (copied) and the claim's attempt */
typedef struct Got
{
	int64		id;
	int32		attempt;
	HeapTuple	tup;
} Got;

static int
got_cmp(const void *a, const void *b)
{
	int64		x = ((const Got *) a)->id;
	int64		y = ((const Got *) b)->id;

	return x < y ? -1 : x > y ? 1 : 0;
}

/*
 * One pass over the window with a fresh snapshot (as each run of the
 * statement had): claims up to want messages into got[]; *ngot how many.
 * *full: window unclaimed ready messages are left after the claims.
 * Returns false when shared memory was full (claim no more).
 */
static bool
window_pass(Window *w, Datum *values, int32 window, int32 want, Got *got,
			int *ngot, Lapsed *l, bool *full, IdemClaimShare *share)
{
	int32		topic_id = DatumGetInt32(values[0]);
	TimestampTz now = DatumGetTimestampTz(values[4]);
	Snapshot	snap;
	CommandId	cid;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	TupleTableSlot *lslot;
	int32		seen = 0;		/* ready, visible, not claimed by another */
	int32		taken = 0;		/* of them, locked by this pass */
	bool		room = true;

	*ngot = 0;
	*full = false;
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	snap = GetActiveSnapshot();
	cid = GetCurrentCommandId(true);

	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(topic_id));
	ScanKeyInit(&skey[1], 2, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
				TimestampTzGetDatum(now));
	slot = table_slot_create(w->heap, NULL);
	lslot = table_slot_create(w->heap, NULL);
	scan = IDEM_INDEX_BEGINSCAN(w->heap, w->ready, snap, 2, 0);
	scan->xs_want_itup = true;	/* the id, from the index entry */
	index_rescan(scan, skey, 2, NULL, 0);
	while (*ngot < want && index_getnext_tid(scan, ForwardScanDirection) != NULL)
	{
		IdemOutboxClaim c;
		bool		isnull;
		int64		id;
		Datum		key;
		ItemPointerData tid;
		TM_FailureData tmfd;
		TM_Result	res;
		int32		attempt;
		int			lockflags = TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS;

		CHECK_FOR_INTERRUPTS();

		/*
		 * Claimed: not in the window.  Asked before the heap is read (the
		 * entry's id is the row's: an id changes only by redrive, of a dead
		 * row, which is in no entry of this index), so that relays skip each
		 * other's claims at the cost of the index entry alone.
		 */
		id = DatumGetInt64(index_getattr(scan->xs_itup, 3, scan->xs_itupdesc, &isnull));
		if (claim_read(id, &c) && c.until > now)
			continue;
		if (!index_fetch_heap(scan, slot) || !is_pending(slot, w))
			continue;
		seen++;
		if (seen > window)
		{
			/* past the window: only counting what is left, for *full */
			if (seen - taken > window)
			{
				*full = true;
				break;
			}
			continue;
		}
		key = slot_getattr(slot, w->att[M_KEY], &isnull);
		if (!isnull && !key_head(w, snap, topic_id, key, id))
			continue;

		/* FOR UPDATE SKIP LOCKED */
		if (!IsolationUsesXactSnapshot())
			lockflags |= TUPLE_LOCK_FLAG_FIND_LAST_VERSION;
		tid = slot->tts_tid;
		res = table_tuple_lock(w->heap, &tid, snap, lslot, cid, LockTupleExclusive,
							   LockWaitSkip, lockflags, &tmfd);
		switch (res)
		{
			case TM_Ok:
				break;
			case TM_WouldBlock:
			case TM_SelfModified:
				continue;
			case TM_Updated:
			case TM_Deleted:
				if (IsolationUsesXactSnapshot())
					ereport(ERROR,
							(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
							 errmsg("could not serialize access due to concurrent update")));
				if (res == TM_Deleted)
					continue;
				elog(ERROR, "unexpected table_tuple_lock status: %u", res);
				break;
			default:
				elog(ERROR, "unexpected table_tuple_lock status: %u", res);
		}
		taken++;

		/*
		 * A newer version was locked: the statement's quals again, and its id
		 * (redrive() gives a dead message a new one: not this candidate)
		 */
		if (tmfd.traversed &&
			(DatumGetInt64(slot_getattr(lslot, w->att[M_ID], &isnull)) != id ||
			 DatumGetInt32(slot_getattr(lslot, w->att[M_TOPIC], &isnull)) != topic_id ||
			 !is_pending(lslot, w) ||
			 DatumGetTimestampTz(slot_getattr(lslot, w->att[M_AVAILABLE], &isnull)) > now ||
			 (claim_read(id, &c) && c.until > now)))
			continue;
		switch (claim_take(id, DatumGetInt32(slot_getattr(lslot, w->att[M_ATTEMPTS], &isnull)),
						   !slot_attisnull(lslot, w->att[M_CLAIM]), values, share, l, &attempt))
		{
			case TAKE_CLAIMED:
				got[*ngot].id = id;
				got[*ngot].attempt = attempt;
				got[*ngot].tup = ExecCopySlotHeapTuple(lslot);
				(*ngot)++;
				break;
			case TAKE_FULL:
				room = false;
				break;
			default:
				break;
		}
		if (!room)
			break;
	}
	index_endscan(scan);
	if (w->keyscan != NULL)
	{
		index_endscan(w->keyscan);	/* it read with this pass's snapshot */
		ExecDropSingleTupleTableSlot(w->keyslot);
		w->keyscan = NULL;
	}
	ExecDropSingleTupleTableSlot(slot);
	ExecDropSingleTupleTableSlot(lslot);
	PopActiveSnapshot();
	if (*ngot >= want || !room)
		*full = false;
	return room;
}

/*
 * Claim up to want messages of the window (values as the claim statements
 * take them: $1 topic id, $3 token, $4 until, $5 now, $6 max_attempts, $7
 * topic name, $8 the window's size) into rsinfo, in id order.  Returns how
 * many, or -1 when the table is not of the shipped shape (then nothing was
 * done: run the statement).  *full: the window was full (claim beyond it).
 * Inside SPI_connect() (the lapsed claims' UPDATE).
 */
int32
idem_outbox_claim_scan(Datum *values, int32 want, ReturnSetInfo *rsinfo, bool *full,
					   IdemClaimShare *share)
{
	int32		window = DatumGetInt32(values[7]);
	int32		claimed = 0;
	Window		w;
	MemoryContext cxt;
	MemoryContext old;

	*full = false;
	/* what a statement with FOR UPDATE says in a read-only transaction */
	PreventCommandIfReadOnly("SELECT FOR UPDATE");
	if (!window_open(&w))
		return -1;
	cxt = AllocSetContextCreate(CurrentMemoryContext, "idempotency claim window",
								ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		Got		   *got;
		int			ngot;
		Lapsed		l;
		bool		room;

		MemoryContextReset(cxt);
		old = MemoryContextSwitchTo(cxt);
		got = palloc((want - claimed) * sizeof(Got));
		lapsed_init(&l, window);	/* only the window's rows are locked */
		room = window_pass(&w, values, window, want - claimed, got, &ngot, &l, full, share);
		MemoryContextSwitchTo(old);
		qsort(got, ngot, sizeof(Got), got_cmp);
		for (int i = 0; i < ngot; i++)
		{
			TupleDesc	desc = RelationGetDescr(w.heap);
			Datum		cols[10];
			bool		nulls[10];

#define COL(n, c) (cols[n] = heap_getattr(got[i].tup, w.att[c], desc, &nulls[n]))
			COL(0, M_ID);
			COL(1, M_MESSAGE_ID);
			cols[2] = values[6];
			nulls[2] = false;
			COL(3, M_KEY);
			COL(4, M_PAYLOAD);
			COL(5, M_HEADERS);
			cols[6] = Int32GetDatum(got[i].attempt);
			nulls[6] = false;
			COL(7, M_PUBLISHED);
			cols[8] = values[2];
			cols[9] = values[3];
			nulls[8] = nulls[9] = false;
#undef COL
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, cols, nulls);
		}
		claimed += ngot;
		lapsed_write(&l);
		if (l.ndead == 0 || claimed >= want || !room)
			break;
	}
	MemoryContextDelete(cxt);
	window_close(&w);
	return claimed;
}
