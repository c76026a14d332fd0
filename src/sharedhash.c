/*-------------------------------------------------------------------------
 *
 * sharedhash.c
 *	  What the shared hash tables of the extension share: how one is made
 *	  in shared memory, and how its entries are found and freed by the
 *	  database (and install or role) they belong to.
 *
 * Three files keep a hash table in shared memory (preloaded only): the
 * outbox's claims (outbox_claims.c), its acked counts (outbox_counts.c)
 * and the statistics (stats.c).  Each keeps its own table, entries and
 * rules; what they share is here, once: one named LWLock per table, its
 * pointer in a small struct of shared memory, and a key that begins with
 * two Oids, the database and then the install or the role (owners.c frees
 * a dropped database's, install's or role's entries through
 * idem_sharedhash_forget() and finds the databases the launcher sweeps
 * through idem_sharedhash_databases()).
 *
 * Locking: each table's t->lock, shared to look at entries, exclusive to
 * remove them.  Nothing waits while holding it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"

#include "idempotency.h"

/* the key every table's entries begin with */
typedef struct SharedKey
{
	Oid			db;
	Oid			owner;			/* the install or the role */
} SharedKey;

/* the struct in shared memory that holds the table's lock */
typedef struct SharedLock
{
	LWLock	   *lock;
} SharedLock;

/* from the table's shmem_request_hook: space for max entries and the lock */
void
idem_sharedhash_request(const IdemSharedHash *t, long max)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(SharedLock)) +
						   hash_estimate_size(max, t->entrysize));
	RequestNamedLWLockTranche(t->name, 1);
}

/*
 * From the table's shmem_startup_hook: make the table (or attach to it),
 * setting t->lock and t->hash; true when it was there already.
 */
bool
idem_sharedhash_attach(IdemSharedHash *t, long max)
{
	bool		found;
	SharedLock *s;
	HASHCTL		info;

	Assert(t->keysize >= sizeof(SharedKey));
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	s = ShmemInitStruct(t->name, sizeof(SharedLock), &found);
	if (!found)
		s->lock = &(GetNamedLWLockTranche(t->name))->lock;
	t->lock = s->lock;
	memset(&info, 0, sizeof(info));
	info.keysize = t->keysize;
	info.entrysize = t->entrysize;
	t->hash = ShmemInitHash(t->hash_name, max, max, &info,
							HASH_ELEM | HASH_BLOBS);
	LWLockRelease(AddinShmemInitLock);
	return found;
}

/*
 * Free the entries of database db and owner (each InvalidOid: any); a
 * table not made (not preloaded) has none.
 */
void
idem_sharedhash_forget(const IdemSharedHash *t, Oid db, Oid owner)
{
	HASH_SEQ_STATUS seq;
	SharedKey  *k;

	if (t->hash == NULL)
		return;
	LWLockAcquire(t->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, t->hash);
	while ((k = (SharedKey *) hash_seq_search(&seq)) != NULL)
	{
		if (OidIsValid(db) && k->db != db)
			continue;
		if (OidIsValid(owner) && k->owner != owner)
			continue;
		hash_search(t->hash, k, HASH_REMOVE, NULL);
	}
	LWLockRelease(t->lock);
}

/* the databases that have entries in t, up to max of them into dbs; how many */
int
idem_sharedhash_databases(const IdemSharedHash *t, Oid *dbs, int max)
{
	HASH_SEQ_STATUS seq;
	SharedKey  *k;
	int			n = 0;
	int			i;

	if (t->hash == NULL)
		return 0;
	LWLockAcquire(t->lock, LW_SHARED);
	hash_seq_init(&seq, t->hash);
	while ((k = (SharedKey *) hash_seq_search(&seq)) != NULL)
	{
		for (i = 0; i < n; i++)
			if (dbs[i] == k->db)
				break;
		if (i < n)
			continue;
		if (n == max)
		{
			hash_seq_term(&seq);
			break;
		}
		dbs[n++] = k->db;
	}
	LWLockRelease(t->lock);
	return n;
}
