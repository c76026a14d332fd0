/*-------------------------------------------------------------------------
 *
 * heldkeys.c
 *	  What this transaction did with which key, undone with savepoints, and
 *	  the commit check built on it.
 *
 * Design: every begin() that returns new or retry, and every complete()
 * or fail(), leaves a HeldKey record.  Records form a stack (newest on
 * top) in TopTransactionContext.  A record belongs to the subtransaction
 * that made it; a later change in the same subtransaction updates the
 * record in place, a change in a deeper subtransaction pushes a copy.
 * So rolling back a subtransaction is popping its records (they are all on
 * top of the stack), and committing one is handing its records to the
 * parent.  The newest record of a key is its current state.
 *
 * At PRE_COMMIT (and PRE_PREPARE) a key whose current state is still
 * HELD_BEGUN fails the commit: the transaction would otherwise store its
 * business writes without the key that guards them.
 *
 * Lookups walk the stack while it is short; past HELD_HASH_AT records a
 * hash table (64-bit key hash -> newest record with that hash) takes over,
 * so a batch that guards many keys in one transaction stays linear.
 *
 * Backend-local only: no shared memory, no locks.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "idempotency.h"

#define HELD_HASH_AT 32

typedef struct HeldHashEntry
{
	uint64		hash;			/* hash key */
	HeldKey    *newest;
} HeldHashEntry;

/* ---------------------------------------------------------------------
 * Local state (all of it lives in TopTransactionContext)
 * ---------------------------------------------------------------------
 */
static HeldKey *held_top = NULL;
static int	held_count = 0;
static HTAB *held_hash = NULL;

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */
static bool
keyid_equal(const KeyId *a, const KeyId *b)
{
	return a->hash == b->hash &&
		a->owner == b->owner &&
		a->key_len == b->key_len &&
		a->scope_len == b->scope_len &&
		memcmp(a->key, b->key, a->key_len) == 0 &&
		memcmp(a->scope, b->scope, a->scope_len) == 0;
}

/* newest record whose hash equals hash, or NULL */
static HeldKey *
newest_with_hash(uint64 hash)
{
	HeldKey    *h;

	if (held_hash)
	{
		HeldHashEntry *e = hash_search(held_hash, &hash, HASH_FIND, NULL);

		return e ? e->newest : NULL;
	}
	for (h = held_top; h; h = h->below)
		if (h->id.hash == hash)
			return h;
	return NULL;
}

static void
build_hash(void)
{
	HASHCTL		ctl;
	HeldKey    *h;

	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(HeldHashEntry);
	ctl.hcxt = TopTransactionContext;
	held_hash = hash_create("idempotency held keys", 256, &ctl,
							HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	/* walking newest first, the first record seen for a hash is the newest */
	for (h = held_top; h; h = h->below)
	{
		bool		found;
		HeldHashEntry *e = hash_search(held_hash, &h->id.hash, HASH_ENTER, &found);

		if (!found)
			e->newest = h;
	}
}

static void
pop_top(void)
{
	HeldKey    *h = held_top;

	held_top = h->below;
	held_count--;
	if (held_hash)
	{
		HeldHashEntry *e = hash_search(held_hash, &h->id.hash, HASH_FIND, NULL);

		Assert(e && e->newest == h);
		if (h->older)
			e->newest = h->older;
		else
			hash_search(held_hash, &h->id.hash, HASH_REMOVE, NULL);
	}
	pfree(h);
}

static void
reset_state(void)
{
	/* the memory goes with TopTransactionContext */
	held_top = NULL;
	held_count = 0;
	held_hash = NULL;
}

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */

/* The current record of key id in this transaction, or NULL. */
HeldKey *
idem_held_lookup(const KeyId *id)
{
	HeldKey    *h;

	for (h = newest_with_hash(id->hash); h; h = h->older)
		if (keyid_equal(&h->id, id))
			return h;
	return NULL;
}

/*
 * Make proto (with its key strings) the current record of its key in the
 * current subtransaction and return the stored record.  When the key's
 * current record already belongs to this subtransaction it is overwritten,
 * since rolling this subtransaction back drops it anyway.
 */
HeldKey *
idem_held_push(const HeldKey *proto)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	HeldKey    *cur = idem_held_lookup(&proto->id);
	HeldKey    *h;
	char	   *p;

	if (cur && cur->subid == subid)
	{
		HeldKey    *below = cur->below,
				   *older = cur->older;
		KeyId		id = cur->id;

		memcpy(cur, proto, sizeof(HeldKey));
		cur->below = below;
		cur->older = older;
		cur->id = id;			/* keep our own copies of the strings */
		cur->subid = subid;
		return cur;
	}

	h = MemoryContextAlloc(TopTransactionContext,
						   sizeof(HeldKey) + proto->id.scope_len + proto->id.key_len + 2);
	memcpy(h, proto, sizeof(HeldKey));
	p = (char *) h + sizeof(HeldKey);
	memcpy(p, proto->id.scope, proto->id.scope_len);
	p[proto->id.scope_len] = '\0';
	h->id.scope = p;
	p += proto->id.scope_len + 1;
	memcpy(p, proto->id.key, proto->id.key_len);
	p[proto->id.key_len] = '\0';
	h->id.key = p;
	h->subid = subid;

	h->older = newest_with_hash(h->id.hash);
	h->below = held_top;
	held_top = h;
	held_count++;

	if (held_hash)
	{
		bool		found;
		HeldHashEntry *e = hash_search(held_hash, &h->id.hash, HASH_ENTER, &found);

		e->newest = h;
	}
	else if (held_count > HELD_HASH_AT)
		build_hash();
	return h;
}

/* ---------------------------------------------------------------------
 * Transaction callbacks
 * ---------------------------------------------------------------------
 */
static void
check_unfinished(bool prepare)
{
	HeldKey    *h;
	HeldKey    *first = NULL;
	int			n = 0;

	for (h = held_top; h; h = h->below)
	{
		if (h->state != HELD_BEGUN || idem_held_lookup(&h->id) != h)
			continue;
		n++;
		if (first == NULL)
			first = h;
	}
	if (first == NULL)
		return;

	ereport(ERROR,
			(errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
			 errmsg("cannot %s: %s was begun but neither completed nor failed",
					prepare ? "prepare transaction" : "commit",
					idem_describe_key(&first->id)),
			 errdetail_plural("%d key begun in this transaction is unfinished, so the transaction was rolled back and nothing it wrote was stored.",
							  "%d keys begun in this transaction are unfinished, so the transaction was rolled back and nothing it wrote was stored.",
							  n, n),
			 errhint("Call idempotency.complete() or idempotency.fail() for every key that begin() returned as new or retry before COMMIT.")));
}

static void
held_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			check_unfinished(false);
			break;
		case XACT_EVENT_PRE_PREPARE:
			check_unfinished(true);
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			reset_state();
			break;
		default:
			break;
	}
}

static void
held_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg pg_attribute_unused())
{
	HeldKey    *h;

	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			while (held_top && held_top->subid == mySubid)
				pop_top();
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			for (h = held_top; h && h->subid == mySubid; h = h->below)
				h->subid = parentSubid;
			break;
		default:
			break;
	}
}

void
idem_heldkeys_init(void)
{
	RegisterXactCallback(held_xact_callback, NULL);
	RegisterSubXactCallback(held_subxact_callback, NULL);
}
