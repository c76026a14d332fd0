/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The background workers (preloaded only): the purge launcher, a purge
 *	  worker per database per cycle, and the outbox vacuum worker.
 *
 * The launcher (as autovacuum's) connects to no database, so it never
 * keeps one busy.  Every purge_interval it starts one purge worker per
 * database in turn (every database that accepts connections and is not a
 * template, or only idempotency.database) and waits for it at most
 * purge_timeout, then stops it and goes on.  A purge worker purges every
 * role's expired rows in batches of purge_batch, one transaction per batch
 * (lifecycle.c: idem_purge_expired()), and exits.  Whenever the launcher
 * wakes it also reaps and starts the outbox vacuum worker
 * (outbox_vacuum.c), one at a time in the cluster, and every
 * OWNERS_SWEEP_S it frees the shared memory of databases that are gone
 * (owners.c).  A worker connects like a session, so it puts back every
 * setting a database's or role's ALTER ... SET changed.  They show in
 * pg_stat_activity as "idempotency purge launcher", "idempotency purge
 * worker" and "idempotency outbox vacuum worker".  Signals, failures and
 * slots: src/README.md, "The workers".
 *
 * No locks of their own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "lifecycle.h"
#include "outbox_vacuum.h"

/* ---------------------------------------------------------------------
 * GUCs
 * ---------------------------------------------------------------------
 */
static int	idem_purge_interval_s = 60;
static int	idem_purge_batch = 10000;
static int	idem_purge_timeout_s = 60;
static char *idem_database = NULL;

#define LAUNCHER_NAME "idempotency purge launcher"
#define WORKER_NAME "idempotency purge worker"
#define VACUUM_NAME "idempotency outbox vacuum worker"
#define WORKER_RESTART_S 10
#define VACUUM_RETRY_MS 1000	/* no worker slot free for a vacuum */
#define OWNERS_SWEEP_S 60		/* the sweep of dropped databases' state */

PGDLLEXPORT void idempotency_purge_launcher_main(Datum main_arg);
PGDLLEXPORT void idempotency_purge_worker_main(Datum main_arg);
PGDLLEXPORT void idempotency_outbox_vacuum_main(Datum main_arg);

/* what the launcher hands an outbox vacuum worker (bgw_extra) */
typedef struct VacuumArg
{
	int			slot;			/* outbox_vacuum.c's slot of the database */
	uint32		seq;			/* the run's number */
} VacuumArg;

/* the outbox vacuum worker running, if any (the launcher's) */
static BackgroundWorkerHandle *vacuum_handle = NULL;
static int	vacuum_slot = -1;

/* a database the launcher will purge this cycle */
typedef struct PurgeTarget
{
	Oid			oid;
	char		name[NAMEDATALEN];
} PurgeTarget;

/*
 * What every worker of this file shares: a database connection (to no
 * database for the launcher: shared catalogs only), started once recovery
 * has finished, named by its type (and, for a database's worker, the
 * database).  db InvalidOid: the launcher.
 */
static void
worker_describe(BackgroundWorker *w, const char *function, const char *type,
				int restart_s, Oid db)
{
	memset(w, 0, sizeof(*w));
	w->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	w->bgw_start_time = BgWorkerStart_RecoveryFinished;
	w->bgw_restart_time = restart_s;
	snprintf(w->bgw_library_name, BGW_MAXLEN, "idempotency");
	snprintf(w->bgw_function_name, BGW_MAXLEN, "%s", function);
	snprintf(w->bgw_type, BGW_MAXLEN, "%s", type);
	if (OidIsValid(db))
	{
		snprintf(w->bgw_name, BGW_MAXLEN, "%s for database %u", type, db);
		w->bgw_main_arg = ObjectIdGetDatum(db);
		w->bgw_notify_pid = MyProcPid;
	}
	else
		snprintf(w->bgw_name, BGW_MAXLEN, "%s", type);
}

static void
purge_worker_register(void)
{
	BackgroundWorker worker;

	worker_describe(&worker, "idempotency_purge_launcher_main", LAUNCHER_NAME,
					WORKER_RESTART_S, InvalidOid);
	RegisterBackgroundWorker(&worker);
}

/* ---------------------------------------------------------------------
 * The server's settings, not a database's or a role's
 *
 * A worker connects like a session, and a session takes the settings of
 * its database and role (ALTER DATABASE / ALTER ROLE ... SET).  A
 * database's owner, no superuser, may set many of them for her database:
 * default_transaction_read_only stopped the purge there ("cannot execute
 * SELECT FOR UPDATE in a read-only transaction" every cycle), role and
 * session_authorization made the worker run as another role, search_path,
 * timeouts, the isolation level and the planner's settings change what
 * it does.  So each worker notes every setting's value before it connects
 * (the server's: postgresql.conf, ALTER SYSTEM, the command line, the
 * defaults) and, once connected, puts back each one that a database or
 * role setting changed, as an override nothing later in the worker's life
 * can change; runs as the bootstrap superuser it connected as; and pins
 * search_path to "pg_catalog, pg_temp".  It logs (DEBUG1) the names it put
 * back.
 * ---------------------------------------------------------------------
 */

/* the context a setting is changed in (PGC_INTERNAL: no such setting) */
static GucContext
find_setting_context(struct config_generic **vars, int n, const char *name)
{
	int			i;

	for (i = 0; i < n; i++)
		if (strcmp(vars[i]->name, name) == 0)
			return vars[i]->context;
	return PGC_INTERNAL;
}

/* a setting's value before connecting */
typedef struct ServerSetting
{
	char	   *name;
	char	   *value;
} ServerSetting;

static ServerSetting *server_settings = NULL;
static int	n_server_settings = 0;

/* before connecting: every setting's value (TopMemoryContext) */
static void
server_settings_save(void)
{
	int			n,
				i;
	struct config_generic **vars = idem_guc_variables(&n);
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

	server_settings = palloc(Max(n, 1) * sizeof(ServerSetting));
	for (i = 0; i < n; i++)
	{
		const char *value = GetConfigOption(vars[i]->name, true, false);

		if (value == NULL)
			continue;
		server_settings[n_server_settings].name = pstrdup(vars[i]->name);
		server_settings[n_server_settings].value = pstrdup(value);
		n_server_settings++;
	}
	MemoryContextSwitchTo(old);
}

static const char *
server_setting(const char *name)
{
	int			i;

	for (i = 0; i < n_server_settings; i++)
		if (strcmp(server_settings[i].name, name) == 0)
			return server_settings[i].value;
	return NULL;
}

static void
override_setting(const char *name, const char *value)
{
	(void) set_config_option(name, value, PGC_SUSET, PGC_S_OVERRIDE,
							 GUC_ACTION_SET, true, WARNING, false);
}

/*
 * Once connected: put back what the database's and the role's settings
 * changed (see above).  worker names the worker in the log line.
 */
static void
server_settings_restore(const char *worker)
{
	int			n,
				i;
	struct config_generic **vars;
	List	   *taken = NIL;
	ListCell   *lc;
	StringInfoData names;
	char	   *dbname;

	StartTransactionCommand();
	vars = idem_guc_variables(&n);
	for (i = 0; i < n; i++)
	{
		GucSource	source = vars[i]->source;

		if (source == PGC_S_GLOBAL || source == PGC_S_DATABASE ||
			source == PGC_S_USER || source == PGC_S_DATABASE_USER)
			taken = lappend(taken, pstrdup(vars[i]->name));
	}

	initStringInfo(&names);
	foreach(lc, taken)
	{
		const char *name = lfirst(lc);
		const char *value = server_setting(name);
		GucContext	context = find_setting_context(vars, n, name);

		appendStringInfo(&names, "%s%s", names.len > 0 ? ", " : "", name);
		/* the identity: below; one fixed at connection start: left */
		if (strcmp(name, "role") == 0 || strcmp(name, "session_authorization") == 0 ||
			context == PGC_BACKEND || context == PGC_SU_BACKEND || value == NULL)
			continue;
		override_setting(name, value);
	}

	/* the bootstrap superuser the worker connected as, no other role */
	if (GetSessionUserId() != BOOTSTRAP_SUPERUSERID)
		override_setting("session_authorization",
						 GetUserNameFromId(BOOTSTRAP_SUPERUSERID, false));
	if (GetUserId() != BOOTSTRAP_SUPERUSERID)
		override_setting("role", "none");
	if (GetUserId() != BOOTSTRAP_SUPERUSERID)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s could not run as the bootstrap superuser", worker)));
	override_setting("search_path", "pg_catalog, pg_temp");

	dbname = get_database_name(MyDatabaseId);
	if (names.len > 0)
		elog(DEBUG1, "%s did not take these settings of database \"%s\" or of its role: %s",
			 worker, dbname ? dbname : "?", names.data);
	CommitTransactionCommand();
}

/* ---------------------------------------------------------------------
 * The per-database worker
 * ---------------------------------------------------------------------
 */

/* One purge batch in its own transaction; returns rows deleted. */
static int64
purge_one_batch(int64 *counts)
{
	int64		n;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "purging expired idempotency keys");

	SPI_connect();
	n = idem_purge_expired(InvalidOid, idem_purge_batch,
						   GetCurrentTransactionStartTimestamp(), counts);
	SPI_finish();

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return n;
}

/*
 * Purge until a batch comes back short, or until half of purge_timeout has
 * passed since the worker started (*cut_short set: the rest waits for the
 * next cycle, and the launcher never has to stop a worker that is only
 * busy); returns the number of batches.
 */
static int
purge_until_done(int64 *totals, bool *cut_short)
{
	int			batches = 0;
	bool		full = true;
	TimestampTz stop_at = GetCurrentTimestamp() +
		(TimestampTz) idem_purge_timeout_s * (USECS_PER_SEC / 2);

	*cut_short = false;
	while (full)
	{
		int64		counts[PURGE_NTABLES];
		int			i;

		CHECK_FOR_INTERRUPTS();
		if (batches > 0 && GetCurrentTimestamp() >= stop_at)
		{
			*cut_short = true;
			break;
		}
		purge_one_batch(counts);
		batches++;
		full = false;
		for (i = 0; i < PURGE_NTABLES; i++)
		{
			totals[i] += counts[i];
			if (counts[i] >= idem_purge_batch)
				full = true;
		}
	}
	return batches;
}

/* is the extension installed in this database?  *dbname gets its name */
static bool
extension_installed(char **dbname)
{
	bool		installed;
	char	   *name;

	StartTransactionCommand();
	installed = OidIsValid(get_extension_oid("idempotency", true));
	name = get_database_name(MyDatabaseId);
	*dbname = MemoryContextStrdup(TopMemoryContext, name ? name : "?");
	CommitTransactionCommand();
	return installed;
}

void
idempotency_purge_worker_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	int64		totals[PURGE_NTABLES] = {0};
	int			batches;
	bool		cut_short;
	char	   *dbname;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* a dropped database: "database N does not exist" (FATAL), one line */
	server_settings_save();
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	/* after: putting back application_name reports it too */
	server_settings_restore(WORKER_NAME);
	pgstat_report_appname(WORKER_NAME);

	if (!extension_installed(&dbname))
	{
		elog(DEBUG1, WORKER_NAME " found no extension idempotency in database \"%s\"",
			 dbname);
		proc_exit(0);
	}

	/* an ERROR is reported and ends the worker; the next cycle tries again */
	batches = purge_until_done(totals, &cut_short);

	ereport(totals[0] + totals[1] + totals[2] + totals[3] > 0 || cut_short ? LOG : DEBUG1,
			(errmsg(WORKER_NAME " purged %lld expired keys, %lld tokens, %lld messages and %lld delivered outbox messages in database \"%s\" (%d batches)",
					(long long) totals[0], (long long) totals[1],
					(long long) totals[2], (long long) totals[3], dbname,
					batches),
			 cut_short ?
			 errdetail("It began no batch after half of idempotency.purge_timeout (%d s); the rest is purged next cycle.",
					   idem_purge_timeout_s) : 0));
	proc_exit(0);
}

/*
 * The outbox vacuum worker: VACUUM of the database's outbox table
 * (outbox_vacuum.c), then it exits; the launcher learns from the slot how
 * it went.  A dropped database ends it at its start (FATAL, one line).
 */
void
idempotency_outbox_vacuum_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	VacuumArg	arg;

	memcpy(&arg, MyBgworkerEntry->bgw_extra, sizeof(arg));
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	server_settings_save();
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	/* after: putting back application_name reports it too */
	server_settings_restore(VACUUM_NAME);
	pgstat_report_appname(VACUUM_NAME);

	/*
	 * Unthrottled, whatever the database says: one outbox vacuum worker
	 * serves the whole cluster, and a database owner (no superuser) may ALTER
	 * DATABASE ... SET vacuum_cost_delay, which would slow it down for every
	 * other database (test/t/017_outbox_vacuum_attack.pl).  A manual VACUUM's
	 * defaults: no cost delay, the default limit.
	 */
	SetConfigOption("vacuum_cost_delay", "0", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("vacuum_cost_limit", "200", PGC_SUSET, PGC_S_OVERRIDE);
	idem_outbox_vacuum_run(arg.slot, arg.seq);
	proc_exit(0);
}

/* ---------------------------------------------------------------------
 * The launcher
 * ---------------------------------------------------------------------
 */

/*
 * The databases to purge this cycle, allocated in cxt: every one that
 * accepts connections and is not a template, or idempotency.database only
 * (a configured one that does not exist is logged unless quiet).  With
 * all, *all gets the oid of every database there is (an OidList in cxt).
 */
static List *
databases_to_purge(MemoryContext cxt, bool quiet, List **all)
{
	List	   *targets = NIL;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	bool		named = idem_database != NULL && idem_database[0] != '\0';
	bool		found_named = false;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);
		PurgeTarget *t;
		MemoryContext old;

		if (all != NULL)
		{
			old = MemoryContextSwitchTo(cxt);
			*all = lappend_oid(*all, db->oid);
			MemoryContextSwitchTo(old);
		}
		if (named)
		{
			if (strcmp(NameStr(db->datname), idem_database) != 0)
				continue;
			found_named = true;
		}
		else if (db->datistemplate)
			continue;
		if (!db->datallowconn || IDEM_DATABASE_IS_INVALID(db))
			continue;
		old = MemoryContextSwitchTo(cxt);
		t = palloc(sizeof(PurgeTarget));
		t->oid = db->oid;
		strlcpy(t->name, NameStr(db->datname), NAMEDATALEN);
		targets = lappend(targets, t);
		MemoryContextSwitchTo(old);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	PopActiveSnapshot();
	CommitTransactionCommand();

	if (named && !found_named && !quiet)
		ereport(LOG,
				(errmsg(LAUNCHER_NAME ": database \"%s\" (idempotency.database) does not exist",
						idem_database),
				 errhint("Set idempotency.database to '' to purge every database where the extension is installed.")));
	return targets;
}

/*
 * Free the shared memory of databases that are gone (owners.c): at the
 * launcher's start and every OWNERS_SWEEP_S.  Returns how long until the
 * next (ms).
 */
static long
owners_tick(void)
{
	static TimestampTz last = 0;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz due = last + (TimestampTz) OWNERS_SWEEP_S * USECS_PER_SEC;

	if (last != 0 && now < due)
		return (long) ((due - now + 999) / 1000);
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	idem_owners_sweep();
	CommitTransactionCommand();
	last = GetCurrentTimestamp();
	return OWNERS_SWEEP_S * 1000L;
}

/*
 * The outbox vacuum, each time the launcher wakes: reap the worker that
 * ended, then, if none runs, start one for the database due (the one with
 * the most acks at or over idempotency.outbox_vacuum_after).  Returns how
 * long the launcher may sleep before it must look again (ms; -1: until its
 * latch is set).
 */
static long
vacuum_tick(void)
{
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext cxt;
	List	   *targets;
	List	   *all = NIL;
	ListCell   *lc;
	bool		full;
	bool		allowed = false;
	BackgroundWorker worker;
	VacuumArg	arg;
	long		wait_ms;
	Oid			db;
	int			slot;

	if (vacuum_handle != NULL)
	{
		pid_t		pid;
		BgwHandleStatus status = GetBackgroundWorkerPid(vacuum_handle, &pid);

		if (status == BGWH_POSTMASTER_DIED)
			proc_exit(1);
		if (status != BGWH_STOPPED)
			return -1;			/* its end sets the latch */
		idem_outbox_vacuum_end(vacuum_slot, now);
		pfree(vacuum_handle);
		vacuum_handle = NULL;
		vacuum_slot = -1;
	}

	full = idem_outbox_vacuum_full();
	slot = idem_outbox_vacuum_due(now, &db, &wait_ms);
	if (slot < 0 && !full)
		return wait_ms;

	/*
	 * may it be vacuumed (as the purge would visit it)?  which databases
	 * exist?
	 */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "idempotency outbox vacuum launch",
								ALLOCSET_DEFAULT_SIZES);
	targets = databases_to_purge(cxt, true, full ? &all : NULL);
	if (full)
	{
		Oid		   *dbs = MemoryContextAlloc(cxt, sizeof(Oid) * Max(list_length(all), 1));
		int			n = 0;

		foreach(lc, all)
			dbs[n++] = lfirst_oid(lc);
		idem_outbox_vacuum_forget_others(dbs, n);
	}
	foreach(lc, targets)
	{
		if (((PurgeTarget *) lfirst(lc))->oid == db)
			allowed = true;
	}
	MemoryContextDelete(cxt);
	if (slot < 0)
		return wait_ms;
	if (!allowed)
	{
		elog(DEBUG1, LAUNCHER_NAME ": the outbox of database %u is not vacuumed (a template, no connections allowed, or not idempotency.database)",
			 db);
		idem_outbox_vacuum_skip(slot);
		return 0;
	}

	worker_describe(&worker, "idempotency_outbox_vacuum_main", VACUUM_NAME,
					BGW_NEVER_RESTART, db);
	arg.slot = slot;
	arg.seq = idem_outbox_vacuum_next(slot);
	memcpy(worker.bgw_extra, &arg, sizeof(arg));
	if (!RegisterDynamicBackgroundWorker(&worker, &vacuum_handle))
	{
		vacuum_handle = NULL;
		elog(DEBUG1, LAUNCHER_NAME ": no background worker slot free to vacuum the outbox of database %u; trying again in %d ms",
			 db, VACUUM_RETRY_MS);
		return VACUUM_RETRY_MS;
	}
	vacuum_slot = slot;
	idem_outbox_vacuum_begin(slot, arg.seq);
	return -1;
}

/* the shorter of two waits in ms, -1 meaning none */
static long
shorter_wait(long a, long b)
{
	if (a < 0)
		return b;
	if (b < 0)
		return a;
	return Min(a, b);
}

/*
 * Wait for the worker of t to end, at most idempotency.purge_timeout: one
 * database never holds up the others.  A worker still running then (waiting
 * on a lock no batch can skip, such as a LOCK TABLE) is told to stop
 * (SIGTERM: its batch rolls back) and the launcher says so, naming the
 * database.  The launcher's latch is set when the worker ends (bgw_notify_pid).
 */
static void
wait_for_worker(const PurgeTarget *t, BackgroundWorkerHandle *handle)
{
	TimestampTz deadline = GetCurrentTimestamp() +
		(TimestampTz) idem_purge_timeout_s * USECS_PER_SEC;

	for (;;)
	{
		pid_t		pid;
		BgwHandleStatus status = GetBackgroundWorkerPid(handle, &pid);
		TimestampTz now;

		if (status == BGWH_STOPPED)
			return;
		if (status == BGWH_POSTMASTER_DIED)
			proc_exit(1);
		now = GetCurrentTimestamp();
		if (now >= deadline)
			break;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 shorter_wait((long) ((deadline - now + 999) / 1000), vacuum_tick()),
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	ereport(LOG,
			(errmsg(LAUNCHER_NAME ": the purge of database \"%s\" took longer than idempotency.purge_timeout (%d s); it is stopped, and the next database is purged",
					t->name, idem_purge_timeout_s),
			 errdetail("The worker was waiting for a lock no batch can skip, or a batch took that long; its last batch rolls back and the next cycle tries again."),
			 errhint("See pg_locks for a transaction holding a lock on the tables of schema idempotency in that database.")));
	TerminateBackgroundWorker(handle);
	if (WaitForBackgroundWorkerShutdown(handle) == BGWH_POSTMASTER_DIED)
		proc_exit(1);
}

/*
 * Start the worker for one database and wait for it to end (at most
 * purge_timeout).  Returns false when no worker slot was free (the rest of
 * the cycle is skipped).
 */
static bool
purge_database(const PurgeTarget *t)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	pid_t		pid;

	worker_describe(&worker, "idempotency_purge_worker_main", WORKER_NAME,
					BGW_NEVER_RESTART, t->oid);

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		ereport(LOG,
				(errmsg(LAUNCHER_NAME ": no background worker slot free to purge database \"%s\"; trying again in %d s",
						t->name, idem_purge_interval_s),
				 errhint("Raise max_worker_processes.")));
		return false;
	}
	if (WaitForBackgroundWorkerStartup(handle, &pid) == BGWH_POSTMASTER_DIED)
		proc_exit(1);
	wait_for_worker(t, handle);
	pfree(handle);
	return true;
}

void
idempotency_purge_launcher_main(Datum main_arg pg_attribute_unused())
{
	MemoryContext cycle_cxt;
	TimestampTz last_end = 0;	/* when the last cycle ended; 0: none yet */

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	if (IsBinaryUpgrade)
		proc_exit(0);

	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname(LAUNCHER_NAME);
	cycle_cxt = AllocSetContextCreate(TopMemoryContext, "idempotency purge cycle",
									  ALLOCSET_DEFAULT_SIZES);
	idem_outbox_vacuum_attach();	/* acks set the latch: vacuum_tick() */
	ereport(LOG,
			(errmsg(LAUNCHER_NAME " started: interval %d s, batch %d, timeout %d s, databases: %s, outbox vacuum after %d acked messages",
					idem_purge_interval_s, idem_purge_batch, idem_purge_timeout_s,
					idem_database && idem_database[0] ? idem_database :
					"every one with the extension", idem_outbox_vacuum_after)));

	/*
	 * A cycle starts when purge_interval has passed since the last one ended
	 * (at once the first time), whatever else sets the latch meanwhile (the
	 * workers' start and end do, SIGHUP, and acks: the outbox vacuum, looked
	 * at each time the latch wakes the launcher).
	 */
	for (;;)
	{
		int			events = WL_LATCH_SET | WL_EXIT_ON_PM_DEATH;
		long		timeout = -1;
		long		vacuum_wait;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		if (idem_purge_interval_s > 0)
		{
			TimestampTz due = last_end + (TimestampTz) idem_purge_interval_s * USECS_PER_SEC;
			TimestampTz now = GetCurrentTimestamp();

			if (last_end == 0 || now >= due)
			{
				List	   *targets = databases_to_purge(cycle_cxt, false, NULL);
				ListCell   *lc;

				foreach(lc, targets)
				{
					CHECK_FOR_INTERRUPTS();
					if (!purge_database((PurgeTarget *) lfirst(lc)))
						break;
				}
				MemoryContextReset(cycle_cxt);
				last_end = GetCurrentTimestamp();
				due = last_end + (TimestampTz) idem_purge_interval_s * USECS_PER_SEC;
				now = last_end;
			}
			timeout = (long) ((due - now + 999) / 1000);
		}
		vacuum_wait = vacuum_tick();
		timeout = shorter_wait(timeout, vacuum_wait);
		timeout = shorter_wait(timeout, owners_tick());
		if (timeout >= 0)
			events |= WL_TIMEOUT;
		(void) WaitLatch(MyLatch, events, timeout, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* from _PG_init: our GUCs; preloaded, the launcher */
void
idem_worker_init(void)
{
	DefineCustomIntVariable("idempotency.purge_interval",
							"How often the background worker purges expired rows.",
							"0 disables purging; needs the library in shared_preload_libraries.",
							&idem_purge_interval_s,
							60, 0, INT_MAX / 1000,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.purge_batch",
							"Rows the background worker deletes per table and transaction.",
							NULL,
							&idem_purge_batch,
							10000, 1, INT_MAX,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.purge_timeout",
							"Longest turn of one database in a purge cycle of the background worker.",
							"A worker begins no batch after half of it; the launcher stops a worker still running at its end and goes on to the next database.",
							&idem_purge_timeout_s,
							60, 1, INT_MAX / 1000,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomStringVariable("idempotency.database",
							   "Only database whose expired rows the background worker purges.",
							   "Empty (the default): every database where the extension is installed.",
							   &idem_database,
							   "",
							   PGC_SIGHUP, 0,
							   NULL, NULL, NULL);

	if (process_shared_preload_libraries_in_progress)
		purge_worker_register();
}
