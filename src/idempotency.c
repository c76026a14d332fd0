/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *	  Module load and configuration of the idempotency extension.
 *
 * _PG_init defines the GUCs and asks every other file to register what it
 * needs (transaction callbacks, cache invalidation callbacks).  The module
 * works loaded on demand (CREATE EXTENSION, first call) or preloaded; only
 * preloaded does it register the purge background worker (worker.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/inval.h"

#include "compat.h"
#include "idempotency.h"

PG_MODULE_MAGIC;

/* ---------------------------------------------------------------------
 * GUCs
 * ---------------------------------------------------------------------
 */
int			idem_lock_wait_ms = 5000;
int			idem_default_ttl_s = 24 * 60 * 60;
int			idem_max_key_length = 255;
int			idem_purge_interval_s = 60;
int			idem_purge_batch = 10000;
int			idem_purge_timeout_s = 60;
char	   *idem_database = NULL;
int			idem_stats_max = 1000;
int			idem_log_waits_ms = -1;

void		_PG_init(void);

/*
 * One relcache callback for the whole library, registered by the first
 * cache that needs it in a process, not at load time: the server has ten
 * slots per process, and with shared_preload_libraries a callback
 * registered in _PG_init would take one in every process the postmaster
 * starts, walsenders included, where Citus and pgoutput need theirs (a
 * logical shard move failed with "out of relcache_callback_list slots").
 */
static bool relcache_watched = false;

static void
relcache_inval(Datum arg pg_attribute_unused(), Oid relid)
{
	idem_runas_relcache(relid);
	idem_keyid_relcache(relid);
	idem_keystore_relcache(relid);
	idem_outbox_relcache(relid);
}

/* call before filling a cache that a relcache invalidation must clear */
void
idem_relcache_watch(void)
{
	if (relcache_watched)
		return;
	CacheRegisterRelcacheCallback(relcache_inval, (Datum) 0);
	relcache_watched = true;
}

void
_PG_init(void)
{
	DefineCustomIntVariable("idempotency.lock_wait",
							"How long begin() waits for a key another transaction holds.",
							"After this time begin() raises IK002; 0 raises it at once.",
							&idem_lock_wait_ms,
							5000, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.default_ttl",
							"How long a key lives when begin() is given no ttl.",
							"An expired key behaves as if it did not exist.",
							&idem_default_ttl_s,
							24 * 60 * 60, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_key_length",
							"Longest idempotency key or scope accepted, in characters.",
							NULL,
							&idem_max_key_length,
							255, 1, 1024,
							PGC_USERSET, 0,
							NULL, NULL, NULL);

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

	/* a PGC_POSTMASTER setting can only be defined while preloading */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("idempotency.stats_max",
								"Most (database, role, scope) entries idempotency.stats keeps.",
								"The least-used entries are evicted.",
								&idem_stats_max,
								1000, 10, INT_MAX / 2,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.log_waits",
							"Logs a wait for a key lock that took at least this long.",
							"-1 (the default) logs none; 0 logs every wait.",
							&idem_log_waits_ms,
							-1, -1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	IDEM_RESERVE_GUC_PREFIX("idempotency");

	idem_runas_init();
	idem_heldkeys_init();
	idem_stats_init();
	idem_wakeup_init();

	if (process_shared_preload_libraries_in_progress)
		idem_purge_worker_register();
}
