/*-------------------------------------------------------------------------
 *
 * keyfast.c
 *	  The key store's fast path (stores floor): a key's row read by probing
 *	  the primary key, a new row written through the executor.
 *
 * Design: taken only for a table of the shipped shape (keytable.c: a plain
 * heap with exactly the shipped columns and types, no triggers and no
 * rules).  Lookups probe the primary key directly (index_beginscan): no
 * parser, planner or executor on the path every request takes.  A new row
 * goes through the executor's simple-relation insert, as logical
 * replication apply writes rows: NOT NULL and CHECK constraints, every
 * index that is ready for inserts (so CREATE INDEX CONCURRENTLY and REINDEX
 * CONCURRENTLY stay consistent), expression and partial indexes, exclusion
 * constraints.  The executor's structures come from the server's
 * constructors (compat.h).
 *
 * Locking: the caller has opened the table (idem_store_open()); the probe
 * takes AccessShareLock on the primary key.  Snapshots are the caller's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */


/*
 * Probe the primary key for key id under snapshot snap.  Returns whether a
 * row is visible; fills *out (response copied into outcxt) and *xmin.
 */
bool
idem_store_probe(Relation heap, const KeyId *id, Snapshot snap, StoredKey *out,
				 MemoryContext outcxt, TransactionId *xmin)
{
	Relation	index;
	TupleTableSlot *slot;
	ScanKeyData skey[3];
	IndexScanDesc scan;
	bool		found;

	/*
	 * The primary key as the relcache knows it now that the table is locked
	 * (idem_store_resolve() checked its columns).
	 */
	index = index_open(IDEM_PRIMARY_KEY_INDEX(heap), AccessShareLock);
	slot = table_slot_create(heap, NULL);

	for (int i = 0; i < 3; i++)
	{
		AttrNumber	att = index->rd_index->indkey.values[i];
		const char *val;
		int			len;

		if (att == idem_store.attnums[COL_OWNER])
		{
			ScanKeyInit(&skey[i], i + 1, BTEqualStrategyNumber, F_OIDEQ,
						ObjectIdGetDatum(id->owner));
			continue;
		}
		if (att == idem_store.attnums[COL_SCOPE])
		{
			val = id->scope;
			len = id->scope_len;
		}
		else if (att == idem_store.attnums[COL_KEY])
		{
			val = id->key;
			len = id->key_len;
		}
		else
			elog(ERROR, "primary key of idempotency.idempotency_key changed under us");
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[i], F_TEXTEQ,
							   PointerGetDatum(cstring_to_text_with_len(val, len)));
	}
	scan = IDEM_INDEX_BEGINSCAN(heap, index, snap, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found && out != NULL)
	{
		bool		isnull;
		Datum		d;
		char	   *status;

#define COL(c) slot_getattr(slot, idem_store.attnums[c], &isnull)
		memset(out, 0, sizeof(StoredKey));
		out->found = true;
		status = TextDatumGetCString(COL(COL_STATUS));
		out->status = status[0];	/* i(n_progress), c(ompleted), f(ailed) */
		pfree(status);
		d = COL(COL_REQUEST_HASH);
		if (!isnull)
		{
			bytea	   *h = DatumGetByteaPP(d);

			if (VARSIZE_ANY_EXHDR(h) == FINGERPRINT_LEN)
			{
				out->has_hash = true;
				memcpy(out->request_hash, VARDATA_ANY(h), FINGERPRINT_LEN);
			}
		}
		d = COL(COL_RESPONSE);
		if (!isnull)
		{
			MemoryContext old = MemoryContextSwitchTo(outcxt);

			out->response = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
		d = COL(COL_RETRYABLE);
		out->retryable = isnull ? false : DatumGetBool(d);
		out->attempts = DatumGetInt32(COL(COL_ATTEMPTS));
		out->created_at = DatumGetTimestampTz(COL(COL_CREATED_AT));
		out->updated_at = DatumGetTimestampTz(COL(COL_UPDATED_AT));
		out->expires_at = DatumGetTimestampTz(COL(COL_EXPIRES_AT));
		d = COL(COL_LOCKED_UNTIL);
		out->locked_until = isnull ? 0 : DatumGetTimestampTz(d);
		if (idem_store.recovery)
		{
			MemoryContext old = MemoryContextSwitchTo(outcxt);

			d = COL(COL_RECOVERY_POINT);
			if (!isnull)
				out->recovery_point = DatumGetTextPCopy(d);
			d = COL(COL_RECOVERY_STATE);
			if (!isnull)
				out->recovery_state = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
#undef COL
	}
	if (found)
	{
		bool		isnull;

		*xmin = DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber,
													  &isnull));
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	return found;
}

/*
 * Insert a row through the executor's simple-relation insert (the way
 * logical replication apply does): constraints, index readiness, every
 * index.  Only on the fast path: no triggers, rules or partitions, and
 * values already of the columns' types.  values/nulls are in $n order
 * (keywrite.c's, the seed at SEED_ARG).
 */
void
idem_store_insert(Relation rel, Datum *values, const char *nulls)
{
	TupleDesc	td = RelationGetDescr(rel);
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *rri;
	TupleTableSlot *slot;

	/* allocated by the server, never by us (compat.h: the ABI trap) */
	rri = IDEM_NEW_RESULT_REL(estate, rel);
	estate->es_output_cid = GetCurrentCommandId(true);
	ExecOpenIndices(rri, false);

	slot = ExecInitExtraTupleSlot(estate, td, &TTSOpsVirtual);
	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, sizeof(bool) * td->natts);
	for (int i = 0; i < NUM_BASE_COLS; i++)
	{
		slot->tts_values[idem_store.attnums[i] - 1] = values[i];
		slot->tts_isnull[idem_store.attnums[i] - 1] = nulls[i] == 'n';
	}
	if (idem_store.seed)
	{
		/* the new row's seed, as the SQL path's $13 (keywrite.c) */
		slot->tts_values[idem_store.attnums[COL_DERIVE_SEED] - 1] = values[SEED_ARG];
		slot->tts_isnull[idem_store.attnums[COL_DERIVE_SEED] - 1] = nulls[SEED_ARG] == 'n';
	}
	ExecStoreVirtualTuple(slot);
	IDEM_SIMPLE_INSERT(rri, estate, slot);

	idem_free_result_rel(rri);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
}
