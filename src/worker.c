/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The purge background worker.
 *
 * Registered only when the library is in shared_preload_libraries.  It
 * connects to idempotency.database and, every idempotency.purge_interval,
 * deletes expired rows of every role in batches of idempotency.purge_batch,
 * one short transaction per batch (lifecycle.c: idem_purge_expired), until a
 * batch comes back short.  It logs what it removed (LOG when something was
 * removed, DEBUG1 otherwise).
 *
 * Signals: SIGHUP rereads the configuration (a new idempotency.database
 * makes the worker exit, so that the postmaster starts it again, connected
 * to that database, after WORKER_RESTART_S); SIGTERM ends the worker at
 * once (die(); the executor checks for interrupts).  An ERROR in a cycle is
 * reported, its transaction aborted, and the worker sleeps until the next
 * cycle; a FATAL exit is restarted by the postmaster after
 * WORKER_RESTART_S.  Under binary upgrade it exits at once.  A database
 * without the extension is skipped (DEBUG1).
 *
 * It shows in pg_stat_activity with backend_type "idempotency purge worker".
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "executor/spi.h"
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

#include "idempotency.h"

#define WORKER_NAME "idempotency purge worker"
#define WORKER_RESTART_S 10

PGDLLEXPORT void idempotency_purge_worker_main(Datum main_arg);

void
idem_purge_worker_register(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = WORKER_RESTART_S;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempotency");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idempotency_purge_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, WORKER_NAME);
	snprintf(worker.bgw_type, BGW_MAXLEN, WORKER_NAME);
	RegisterBackgroundWorker(&worker);
}

/* One purge batch in its own transaction; returns rows deleted. */
static int64
purge_one_batch(int64 *counts)
{
	int64		n = 0;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "purging expired idempotency keys");

	if (OidIsValid(get_namespace_oid("idempotency", true)))
	{
		SPI_connect();
		n = idem_purge_expired(InvalidOid, idem_purge_batch,
						  GetCurrentTransactionStartTimestamp(), counts);
		SPI_finish();
	}
	else
		memset(counts, 0, sizeof(int64) * PURGE_NTABLES);

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return n;
}

/* Purge until a batch comes back short; returns the number of batches. */
static int
purge_until_done(int64 *totals)
{
	int			batches = 0;
	bool		full = true;

	while (full)
	{
		int64		counts[PURGE_NTABLES];
		int			i;

		CHECK_FOR_INTERRUPTS();
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

/* One purge cycle; an ERROR ends the cycle, not the worker. */
static void
purge_cycle(void)
{
	int64		totals[PURGE_NTABLES] = {0, 0, 0};
	int			batches;
	MemoryContext cxt = CurrentMemoryContext;

	PG_TRY();
	{
		batches = purge_until_done(totals);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		EmitErrorReport();
		AbortCurrentTransaction();
		FlushErrorState();
		pgstat_report_activity(STATE_IDLE, NULL);
		ereport(LOG,
				(errmsg(WORKER_NAME " will try again in %d s", idem_purge_interval_s)));
		return;
	}
	PG_END_TRY();

	ereport(totals[0] + totals[1] + totals[2] > 0 ? LOG : DEBUG1,
			(errmsg(WORKER_NAME " purged %lld expired keys, %lld tokens and %lld messages in database \"%s\" (%d batches)",
					(long long) totals[0], (long long) totals[1],
					(long long) totals[2], idem_database, batches)));
}

void
idempotency_purge_worker_main(Datum main_arg pg_attribute_unused())
{
	char	   *database;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	if (IsBinaryUpgrade)
		proc_exit(0);

	database = pstrdup(idem_database);
	BackgroundWorkerInitializeConnection(database, NULL, 0);
	pgstat_report_appname(WORKER_NAME);
	ereport(LOG,
			(errmsg(WORKER_NAME " started for database \"%s\", interval %d s, batch %d",
					idem_database, idem_purge_interval_s, idem_purge_batch)));

	for (;;)
	{
		int			events = WL_LATCH_SET | WL_EXIT_ON_PM_DEATH;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			if (strcmp(database, idem_database) != 0)
			{
				ereport(LOG,
						(errmsg(WORKER_NAME " restarting to move from database \"%s\" to \"%s\"",
								database, idem_database)));
				proc_exit(1);
			}
		}
		if (idem_purge_interval_s > 0)
		{
			purge_cycle();
			events |= WL_TIMEOUT;
		}
		(void) WaitLatch(MyLatch, events, (long) idem_purge_interval_s * 1000L,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
