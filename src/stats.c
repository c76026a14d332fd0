/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  idempotency.stats: how the guard is used, counted per database, role
 *	  and scope in shared memory; and the LOG line of a long key-lock wait.
 *
 * Design (after contrib/pg_stat_statements): with the library in
 * shared_preload_libraries, a shared hash table holds one entry per
 * (database, role, hash of the scope), at most idempotency.stats_max of
 * them.  An entry keeps the scope clipped to STATS_SCOPE_BYTES (in its
 * database's encoding, which the entry records: stats() converts it to the
 * reading database's, since databases of one cluster may differ) and the
 * counters of enum IdemStat (stats.h) plus the total and longest
 * key-lock wait.  When the table is full, the least-used STATS_DEALLOC_PCT
 * percent of the entries (at least one) are evicted: every count adds 1 to
 * an entry's usage, and every eviction round decays all usages.  At a clean
 * shutdown the postmaster writes the entries to STATS_FILE; the next start
 * reads them back and removes the file, so counters survive a clean
 * restart and are lost in a crash, as pg_stat_statements' are.
 *
 * Without preloading nothing is counted (idem_stats_count() tests one
 * flag), and idempotency.stats raises 55000 with a hint.
 *
 * Counting happens just before the event is reported, including just
 * before an ERROR is raised: counters are not transactional, and a rolled
 * back begin() still counts as new.
 *
 * Locking: stats.lock (an LWLock) guards the hash table: shared to find an
 * entry and count, exclusive to add, evict, reset or load entries.  Each
 * entry's counters have a spinlock, so backends holding the LWLock shared
 * count concurrently.  Nothing here waits while holding a spinlock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "compat.h"
#include "idempotency.h"
#include "stats.h"

/* ---------------------------------------------------------------------
 * GUCs
 * ---------------------------------------------------------------------
 */
static int	idem_stats_max = 1000;

#define STATS_SCOPE_BYTES 64	/* scope kept in an entry, clipped */
#define STATS_DEALLOC_PCT 5		/* entries evicted when the table is full */
#define STATS_USAGE_DECAY 0.99	/* usage kept at each eviction round */
#define STATS_FILE PGSTAT_STAT_PERMANENT_DIRECTORY "/idempotency.stat"
#define STATS_FILE_MAGIC 0x49444d53 /* "IDMS" */
#define STATS_FILE_VERSION 2	/* 2: with each entry's encoding */
#define STATS_TRANCHE "idempotency stats"

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */

/* the hash key: no padding, so it hashes as a blob */
typedef struct StatsKey
{
	Oid			dbid;
	Oid			userid;
	uint64		scope_hash;
} StatsKey;

typedef struct StatsCounters
{
	int64		n[IDEM_STAT_NCOUNTERS];
	double		wait_total_ms;
	double		wait_max_ms;
	double		usage;			/* for eviction */
	TimestampTz since;			/* entry created or reset */
} StatsCounters;

typedef struct StatsEntry
{
	StatsKey	key;			/* must be first */
	slock_t		mutex;			/* protects c */
	int			encoding;		/* of scope: its database's */
	char		scope[STATS_SCOPE_BYTES + 1];
	StatsCounters c;
} StatsEntry;

static bool idem_stats_on = false;	/* preloaded: the counters are in shared
									 * memory */

static IdemSharedHash stats = {
	.name = STATS_TRANCHE,
	.hash_name = "idempotency stats hash",
	.keysize = sizeof(StatsKey),
	.entrysize = sizeof(StatsEntry)
};
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* ---------------------------------------------------------------------
 * Shared memory, and its file
 * ---------------------------------------------------------------------
 */
static void
stats_shmem_request(void)
{
	idem_sharedhash_request(&stats, idem_stats_max);
}

/* a new entry for key (exclusive lock held); NULL if shared memory is out */
static StatsEntry *
entry_enter(const StatsKey *key, const char *scope, int scope_len, int encoding)
{
	StatsEntry *e;
	bool		found;

	e = (StatsEntry *) hash_search(stats.hash, key, HASH_ENTER_NULL, &found);
	if (e != NULL && !found)
	{
		SpinLockInit(&e->mutex);
		memset(&e->c, 0, sizeof(StatsCounters));
		e->c.since = GetCurrentTimestamp();
		if (scope_len > STATS_SCOPE_BYTES)
			scope_len = pg_mbcliplen(scope, scope_len, STATS_SCOPE_BYTES);
		memcpy(e->scope, scope, scope_len);
		e->scope[scope_len] = '\0';
		e->encoding = encoding;
	}
	return e;
}

/* Write the entries to STATS_FILE at a clean shutdown of the postmaster. */
static void
stats_shmem_shutdown(int code, Datum arg pg_attribute_unused())
{
	FILE	   *f;
	HASH_SEQ_STATUS seq;
	StatsEntry *e;
	uint32		header[2] = {STATS_FILE_MAGIC, STATS_FILE_VERSION};
	int32		n;

	if (code != 0 || stats.hash == NULL)
		return;					/* a crash: counters are lost */

	f = AllocateFile(STATS_FILE ".tmp", PG_BINARY_W);
	if (f == NULL)
		goto error;
	n = (int32) hash_get_num_entries(stats.hash);
	if (fwrite(header, sizeof(header), 1, f) != 1 ||
		fwrite(&n, sizeof(n), 1, f) != 1)
		goto error;
	hash_seq_init(&seq, stats.hash);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		if (fwrite(&e->key, sizeof(StatsKey), 1, f) != 1 ||
			fwrite(&e->encoding, sizeof(e->encoding), 1, f) != 1 ||
			fwrite(e->scope, sizeof(e->scope), 1, f) != 1 ||
			fwrite(&e->c, sizeof(StatsCounters), 1, f) != 1)
		{
			hash_seq_term(&seq);
			goto error;
		}
	}
	if (FreeFile(f) != 0)
	{
		f = NULL;
		goto error;
	}
	(void) durable_rename(STATS_FILE ".tmp", STATS_FILE, LOG);
	return;

error:
	ereport(LOG,
			(errcode_for_file_access(),
			 errmsg("could not write file \"%s\": %m", STATS_FILE ".tmp")));
	if (f)
		FreeFile(f);
	unlink(STATS_FILE ".tmp");
}

/* Read STATS_FILE back at startup (exclusive lock held), then remove it. */
static void
stats_load(void)
{
	FILE	   *f;
	uint32		header[2];
	int32		n;
	int32		i;

	f = AllocateFile(STATS_FILE, PG_BINARY_R);
	if (f == NULL)
	{
		if (errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not read file \"%s\": %m", STATS_FILE)));
		return;
	}
	if (fread(header, sizeof(header), 1, f) != 1 ||
		header[0] != STATS_FILE_MAGIC || header[1] != STATS_FILE_VERSION ||
		fread(&n, sizeof(n), 1, f) != 1 || n < 0)
	{
		ereport(LOG,
				(errmsg("ignoring file \"%s\": not written by this version of idempotency",
						STATS_FILE)));
		n = 0;
	}
	for (i = 0; i < n && i < idem_stats_max; i++)
	{
		StatsKey	key;
		int			encoding;
		char		scope[STATS_SCOPE_BYTES + 1];
		StatsCounters c;
		StatsEntry *e;

		if (fread(&key, sizeof(key), 1, f) != 1 ||
			fread(&encoding, sizeof(encoding), 1, f) != 1 ||
			fread(scope, sizeof(scope), 1, f) != 1 ||
			fread(&c, sizeof(c), 1, f) != 1)
		{
			ereport(LOG,
					(errmsg("file \"%s\" is truncated; kept %d entries of %d",
							STATS_FILE, i, n)));
			break;
		}
		scope[STATS_SCOPE_BYTES] = '\0';
		if (!PG_VALID_ENCODING(encoding))
			encoding = PG_SQL_ASCII;	/* bytes as they are */
		e = entry_enter(&key, scope, strlen(scope), encoding);
		if (e == NULL)
			break;
		e->c = c;
	}
	FreeFile(f);
	unlink(STATS_FILE);
}

static void
stats_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	found = idem_sharedhash_attach(&stats, idem_stats_max);
	idem_stats_on = true;

	/* the postmaster (or a single-user backend) keeps the file */
	if (!IsUnderPostmaster)
		on_shmem_exit(stats_shmem_shutdown, (Datum) 0);
	if (found)
		return;
	LWLockAcquire(stats.lock, LW_EXCLUSIVE);
	stats_load();
	LWLockRelease(stats.lock);
}

/* ---------------------------------------------------------------------
 * Counting
 * ---------------------------------------------------------------------
 */
static int
usage_cmp(const void *a, const void *b)
{
	double		ua = (*(StatsEntry *const *) a)->c.usage;
	double		ub = (*(StatsEntry *const *) b)->c.usage;

	return ua < ub ? -1 : ua > ub ? 1 : 0;
}

/*
 * Evict the least-used entries (exclusive lock held: nobody counts, so the
 * usages are read without the spinlocks), and decay the others' usage.
 */
static void
stats_evict(void)
{
	HASH_SEQ_STATUS seq;
	StatsEntry **entries;
	StatsEntry *e;
	long		n = 0;
	long		victims;
	long		i;

	entries = palloc(hash_get_num_entries(stats.hash) * sizeof(StatsEntry *));
	hash_seq_init(&seq, stats.hash);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		e->c.usage *= STATS_USAGE_DECAY;
		entries[n++] = e;
	}
	qsort(entries, n, sizeof(StatsEntry *), usage_cmp);
	victims = Max(1, n * STATS_DEALLOC_PCT / 100);
	for (i = 0; i < victims && i < n; i++)
		hash_search(stats.hash, &entries[i]->key, HASH_REMOVE, NULL);
	pfree(entries);

	/* never silently: the DBA learns that counters were dropped, and why */
	ereport(LOG,
			(errmsg("idempotency.stats is full: the %ld least-used of %ld entries were evicted",
					Min(victims, n), n),
			 errdetail("Their counters are lost; idempotency.stats_max is %d.",
					   idem_stats_max),
			 errhint("Raise idempotency.stats_max (needs a restart) to keep more (database, role, scope) entries.")));
}

/*
 * Add n to counter what of (this database, role owner, scope); for
 * IDEM_STAT_WAITS also wait_ms to the wait time.  Never raises: an entry
 * that cannot be made is not counted.
 */
static void
stats_count(Oid owner, const char *scope, int scope_len, IdemStat what,
			int64 n, double wait_ms)
{
	StatsKey	key;
	StatsEntry *e;

	key.dbid = MyDatabaseId;
	key.userid = owner;
	key.scope_hash = hash_bytes_extended((const unsigned char *) scope, scope_len, 0);

	LWLockAcquire(stats.lock, LW_SHARED);
	e = (StatsEntry *) hash_search(stats.hash, &key, HASH_FIND, NULL);
	if (e == NULL)
	{
		LWLockRelease(stats.lock);
		LWLockAcquire(stats.lock, LW_EXCLUSIVE);
		e = (StatsEntry *) hash_search(stats.hash, &key, HASH_FIND, NULL);
		if (e == NULL)
		{
			if (hash_get_num_entries(stats.hash) >= idem_stats_max)
				stats_evict();
			e = entry_enter(&key, scope, scope_len, GetDatabaseEncoding());
		}
		if (e == NULL)
		{
			LWLockRelease(stats.lock);
			return;
		}
	}
	SpinLockAcquire(&e->mutex);
	e->c.n[what] += n;
	e->c.usage += 1.0;
	if (what == IDEM_STAT_WAITS)
	{
		e->c.wait_total_ms += wait_ms;
		if (wait_ms > e->c.wait_max_ms)
			e->c.wait_max_ms = wait_ms;
	}
	SpinLockRelease(&e->mutex);
	LWLockRelease(stats.lock);
}

/* count one event of key id; a flag test and nothing else unless preloaded */
void
idem_stats_count(const KeyId *id, IdemStat what)
{
	if (idem_stats_on)
		idem_stats_add(id->owner, id->scope, id->scope_len, what, 1);
}

/* Add n to counter what; through idem_stats_count(), or for a sum. */
void
idem_stats_add(Oid owner, const char *scope, int scope_len, IdemStat what,
			   int64 n)
{
	if (idem_stats_on && n != 0)
		stats_count(owner, scope, scope_len, what, n, 0.0);
}

/* A wait of ms milliseconds for the lock of key id has ended (counted). */
void
idem_stats_wait(const KeyId *id, double ms)
{
	if (idem_stats_on)
		stats_count(id->owner, id->scope, id->scope_len, IDEM_STAT_WAITS, 1, ms);
}

/* from _PG_init: our GUCs; preloaded, the shared memory */
void
idem_stats_init(void)
{
	/* a PGC_POSTMASTER setting can only be defined while preloading */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idempotency.stats_max",
								"Most (database, role, scope) entries idempotency.stats keeps.",
								"The least-used entries are evicted.",
								&idem_stats_max,
								1000, 10, INT_MAX / 2,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);

	if (!process_shared_preload_libraries_in_progress)
		return;
	idem_request_shmem(stats_shmem_request);
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = stats_shmem_startup;
}

/* ---------------------------------------------------------------------
 * SQL-callable functions
 * ---------------------------------------------------------------------
 */
static void
require_shared_memory(void)
{
	if (!idem_stats_on)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency statistics are not being collected"),
				 errdetail("The counters live in shared memory, which only a preloaded library has."),
				 errhint("Add idempotency to shared_preload_libraries in postgresql.conf and restart the server.")));
}

#define STATS_COLS (3 + IDEM_STAT_NCOUNTERS + 3)

/* one entry, copied out of shared memory */
typedef struct StatsRow
{
	StatsKey	key;
	int			encoding;
	char		scope[STATS_SCOPE_BYTES + 1];
	StatsCounters c;
} StatsRow;

/*
 * scope, written in encoding, in this database's encoding.  The entries of
 * every database share one table, and the databases of a cluster may have
 * different encodings: convert (as pg_stat_statements does with its query
 * texts), and where this database's encoding cannot hold a character, cut
 * the scope before it and end it with "...".  Never raises.
 */
static char *
scope_for_reader(const char *scope, int encoding)
{
	int			len = strlen(scope);
	int			db = GetDatabaseEncoding();
	int			done;
	char	   *out;
	Oid			proc = InvalidOid;

	if (encoding == db || db == PG_SQL_ASCII || len == 0)
		return pstrdup(scope);
	if (encoding != PG_SQL_ASCII)
		proc = FindDefaultConversionProc(encoding, db);
	out = palloc((Size) len * MAX_CONVERSION_GROWTH + 4);
	if (OidIsValid(proc))
		done = idem_convert_prefix(proc, encoding, db, scope, len, out);
	else						/* nothing converts it: what is valid here */
		done = idem_valid_prefix(db, scope, len, out);
	if (done < len)
		strcat(out, "...");
	return out;
}

/* stats() -> one row per (database, role, scope) the caller may see */
PG_FUNCTION_INFO_V1(idempotency_stats);

Datum
idempotency_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	tupdesc;
	Tuplestorestate *store;
	HASH_SEQ_STATUS seq;
	StatsEntry *e;
	StatsRow   *rows;
	long		nrows = 0;
	Oid			me = GetUserId();
	bool		see_all = has_privs_of_role(me, ROLE_PG_READ_ALL_STATS);

	require_shared_memory();
	idem_init_materialized_srf(fcinfo);
	store = rsinfo->setResult;
	tupdesc = rsinfo->setDesc;
	if (tupdesc->natts != STATS_COLS)
		elog(ERROR, "idempotency.stats() returns %d columns, the library %d",
			 tupdesc->natts, STATS_COLS);

	/* copy the entries out, then convert their scopes without the lock */
	LWLockAcquire(stats.lock, LW_SHARED);
	rows = palloc(Max(hash_get_num_entries(stats.hash), 1) * sizeof(StatsRow));
	hash_seq_init(&seq, stats.hash);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		StatsRow   *r = &rows[nrows];

		if (!see_all && e->key.userid != me)
			continue;
		r->key = e->key;
		r->encoding = e->encoding;
		memcpy(r->scope, e->scope, sizeof(r->scope));
		SpinLockAcquire(&e->mutex);
		r->c = e->c;
		SpinLockRelease(&e->mutex);
		nrows++;
	}
	LWLockRelease(stats.lock);

	for (long n = 0; n < nrows; n++)
	{
		StatsRow   *r = &rows[n];
		Datum		values[STATS_COLS];
		bool		nulls[STATS_COLS];
		int			col = 0;
		int			i;

		memset(nulls, 0, sizeof(nulls));
		values[col++] = ObjectIdGetDatum(r->key.dbid);
		values[col++] = ObjectIdGetDatum(r->key.userid);
		values[col++] = CStringGetTextDatum(scope_for_reader(r->scope, r->encoding));
		for (i = 0; i < IDEM_STAT_NCOUNTERS; i++)
			values[col++] = Int64GetDatum(r->c.n[i]);
		values[col++] = Float8GetDatum(r->c.wait_total_ms);
		values[col++] = Float8GetDatum(r->c.wait_max_ms);
		values[col++] = TimestampTzGetDatum(r->c.since);
		tuplestore_putvalues(store, tupdesc, values, nulls);
	}
	pfree(rows);
	return (Datum) 0;
}

/*
 * Free the entries of database db (InvalidOid: any) and role (InvalidOid:
 * any): owners.c, when a database, an install or a role is gone (the
 * entries of a database are its install's: it has one at a time).
 */
void
idem_stats_forget(Oid db, Oid role)
{
	idem_sharedhash_forget(&stats, db, role);
}

/* the databases that have entries here, up to max of them into dbs; how many */
int
idem_stats_databases(Oid *dbs, int max)
{
	return idem_sharedhash_databases(&stats, dbs, max);
}

/* stats_reset(): forget every counter (superuser unless granted) */
PG_FUNCTION_INFO_V1(idempotency_stats_reset);

Datum
idempotency_stats_reset(PG_FUNCTION_ARGS pg_attribute_unused())
{
	HASH_SEQ_STATUS seq;
	StatsEntry *e;

	require_shared_memory();
	LWLockAcquire(stats.lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, stats.hash);
	while ((e = hash_seq_search(&seq)) != NULL)
		hash_search(stats.hash, &e->key, HASH_REMOVE, NULL);
	LWLockRelease(stats.lock);
	PG_RETURN_VOID();
}
