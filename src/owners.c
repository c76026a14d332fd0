/*-------------------------------------------------------------------------
 *
 * owners.c
 *	  What the extension keeps in shared memory belongs to one database,
 *	  one install of the extension in it and one role; this file frees it
 *	  when they go.
 *
 * The state and its keys:
 *
 *	  outbox claims (outbox_claims.c)    database, install, message id
 *	  acked counts (outbox_counts.c)     database, install, topic id
 *	  statistics (stats.c)               database, role, scope
 *	  outbox vacuum counts (outbox_vacuum.c)  database
 *	  wake-ups (wakeup.c)                database, topic id
 *
 * Oids come back (a database created again with a dropped one's oid from
 * the same template has the same ids), so the state is freed at the drop:
 * an object_access_hook (OAT_DROP) records a dropped database, install
 * (its outbox_message_id_seq, however dropped) or role, and its entries
 * are freed at the drop's commit; outbox_topics.c records a dropped topic
 * (drop_topic(), create_topic() taking over a dropped owner's topic), whose
 * claims are freed at its commit.  The launcher's sweep
 * (idem_owners_sweep(), from worker.c) frees what the hook cannot see: a
 * drop replayed by a standby, an invalid database, a DROP EXTENSION
 * committed by COMMIT PREPARED.  Wake-up entries are never freed, only
 * reused.  Why, and what each drop frees: src/README.md, "Shared memory
 * freed with its owner".
 *
 * Locking: none of its own; the tables' locks inside the files named
 * above.  The drops are kept per (sub)transaction in TopTransactionContext.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "compat.h"
#include "idempotency.h"
#include "outbox_claims.h"
#include "outbox_counts.h"
#include "outbox_vacuum.h"
#include "stats.h"

#define OWNERS_SWEEP_MAX 1024	/* databases looked at per table and sweep */

typedef enum OwnerGone
{
	GONE_DATABASE,
	GONE_INSTALL,
	GONE_ROLE,
	GONE_TOPIC
} OwnerGone;

/* an owner this transaction drops: its state is freed if it commits */
typedef struct Gone
{
	OwnerGone	kind;
	Oid			oid;			/* the database, the install, the role or the
								 * topic (its id) */
	Oid			db;				/* GONE_INSTALL, GONE_TOPIC: its database */
	Oid			gen;			/* GONE_TOPIC: its install */
	int			level;			/* the (sub)transaction's nesting level */
} Gone;

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */
static object_access_hook_type prev_object_access_hook = NULL;
static List *gone = NIL;		/* of Gone, in TopTransactionContext */
static bool callbacks_registered = false;

/* ---------------------------------------------------------------------
 * The drops, freed at their commit
 * ---------------------------------------------------------------------
 */
static void
owners_free(const Gone *g)
{
	switch (g->kind)
	{
		case GONE_DATABASE:
			idem_outbox_claims_forget(g->oid, InvalidOid);
			idem_outbox_counts_forget(g->oid, InvalidOid);
			idem_stats_forget(g->oid, InvalidOid);
			idem_outbox_vacuum_forget(g->oid);
			break;
		case GONE_INSTALL:
			idem_outbox_claims_forget(g->db, g->oid);
			idem_outbox_counts_forget(g->db, g->oid);
			idem_stats_forget(g->db, InvalidOid);
			break;
		case GONE_ROLE:
			idem_stats_forget(InvalidOid, g->oid);
			break;
		case GONE_TOPIC:
			idem_outbox_claims_forget_topic(g->db, g->gen, (int32) g->oid);
			break;
	}
}

static void
owners_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	ListCell   *lc;

	if (gone == NIL)
		return;
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT)
	{
		foreach(lc, gone)
			owners_free((Gone *) lfirst(lc));
	}
	else if (event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT &&
			 event != XACT_EVENT_PREPARE)
		return;
	gone = NIL;					/* its memory goes with TopTransactionContext */
}

/* a subtransaction's drops go with its abort, pass to its parent at commit */
static void
owners_subxact_callback(SubXactEvent event, SubTransactionId mySubid pg_attribute_unused(),
						SubTransactionId parentSubid pg_attribute_unused(),
						void *arg pg_attribute_unused())
{
	int			level = GetCurrentTransactionNestLevel();
	List	   *kept = NIL;
	ListCell   *lc;
	MemoryContext old;

	if (gone == NIL ||
		(event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB))
		return;
	old = MemoryContextSwitchTo(TopTransactionContext);
	foreach(lc, gone)
	{
		Gone	   *g = (Gone *) lfirst(lc);

		if (g->level >= level)
		{
			if (event == SUBXACT_EVENT_ABORT_SUB)
				continue;
			g->level = level - 1;
		}
		kept = lappend(kept, g);
	}
	MemoryContextSwitchTo(old);
	gone = kept;
}

static void
owners_gone(OwnerGone kind, Oid oid, Oid db, Oid gen)
{
	MemoryContext old;
	Gone	   *g;

	if (!callbacks_registered)
	{
		RegisterXactCallback(owners_xact_callback, NULL);
		RegisterSubXactCallback(owners_subxact_callback, NULL);
		callbacks_registered = true;
	}
	old = MemoryContextSwitchTo(TopTransactionContext);
	g = palloc(sizeof(Gone));
	g->kind = kind;
	g->oid = oid;
	g->db = db;
	g->gen = gen;
	g->level = GetCurrentTransactionNestLevel();
	gone = lappend(gone, g);
	MemoryContextSwitchTo(old);
}

static void
owners_object_access(ObjectAccessType access, Oid classId, Oid objectId,
					 int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	if (access != OAT_DROP || subId != 0)
		return;
	if (classId == DatabaseRelationId)
		owners_gone(GONE_DATABASE, objectId, InvalidOid, InvalidOid);
	else if (classId == AuthIdRelationId)
		owners_gone(GONE_ROLE, objectId, InvalidOid, InvalidOid);
	else if (classId == RelationRelationId && objectId == idem_outbox_install())
		owners_gone(GONE_INSTALL, objectId, MyDatabaseId, InvalidOid);
}

/*
 * outbox_topics.c: this transaction deletes topic topic_id with its
 * messages (drop_topic(), or create_topic() taking a dropped owner's name):
 * its claims are freed if it commits.  Catalog reads here, none at the end.
 */
void
idem_owners_topic_gone(int32 topic_id)
{
	Oid			gen;

	if (!idem_outbox_claims_on)
		return;
	gen = idem_outbox_install();
	if (OidIsValid(gen))
		owners_gone(GONE_TOPIC, (Oid) topic_id, MyDatabaseId, gen);
}

/* from _PG_init: preloaded (there is shared memory), the hook */
void
idem_owners_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_object_access_hook = object_access_hook;
	object_access_hook = owners_object_access;
}

/* ---------------------------------------------------------------------
 * The launcher's sweep
 * ---------------------------------------------------------------------
 */

/* is database db gone (no row, or one a failed DROP DATABASE left invalid)? */
static bool
database_gone(Oid db)
{
	HeapTuple	tup = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(db));
	bool		gone_db;

	if (!HeapTupleIsValid(tup))
		return true;
	gone_db = IDEM_DATABASE_IS_INVALID((Form_pg_database) GETSTRUCT(tup));
	ReleaseSysCache(tup);
	return gone_db;
}

/*
 * The purge launcher's sweep (worker.c; in a transaction, connected to no
 * database): free every entry of a database that is gone.  The databases
 * are read from the tables first and looked up after: a database that had
 * entries then existed then, so one not found now was dropped since (a
 * database created after the look-up has no entries yet to lose).
 */
void
idem_owners_sweep(void)
{
	Oid		   *dbs = palloc(sizeof(Oid) * OWNERS_SWEEP_MAX);
	int			n;
	int			i;

	n = idem_outbox_claims_databases(dbs, OWNERS_SWEEP_MAX);
	for (i = 0; i < n; i++)
		if (database_gone(dbs[i]))
			idem_outbox_claims_forget(dbs[i], InvalidOid);
	n = idem_outbox_counts_databases(dbs, OWNERS_SWEEP_MAX);
	for (i = 0; i < n; i++)
		if (database_gone(dbs[i]))
			idem_outbox_counts_forget(dbs[i], InvalidOid);
	n = idem_stats_databases(dbs, OWNERS_SWEEP_MAX);
	for (i = 0; i < n; i++)
		if (database_gone(dbs[i]))
			idem_stats_forget(dbs[i], InvalidOid);
	pfree(dbs);
}
