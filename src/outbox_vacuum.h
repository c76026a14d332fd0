/*-------------------------------------------------------------------------
 *
 * outbox_vacuum.h
 *	  The outbox's table vacuumed after enough acks (outbox_vacuum.c):
 *	  ack() counts, the launcher (worker.c) decides, the outbox vacuum
 *	  worker runs, owners.c frees a dropped database's slot.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_VACUUM_H
#define OUTBOX_VACUUM_H

#include "datatype/timestamp.h"

extern int	idem_outbox_vacuum_after;
extern void idem_outbox_vacuum_init(void);
extern void idem_outbox_vacuum_count(int64 n);
extern void idem_outbox_vacuum_attach(void);
extern int	idem_outbox_vacuum_due(TimestampTz now, Oid *db, long *wait_ms);
extern uint32 idem_outbox_vacuum_next(int slot);
extern void idem_outbox_vacuum_begin(int slot, uint32 seq);
extern void idem_outbox_vacuum_skip(int slot);
extern bool idem_outbox_vacuum_end(int slot, TimestampTz now);
extern bool idem_outbox_vacuum_full(void);
extern void idem_outbox_vacuum_forget_others(const Oid *dbs, int n);
extern void idem_outbox_vacuum_forget(Oid db);
extern void idem_outbox_vacuum_run(int slot, uint32 seq);

#endif							/* OUTBOX_VACUUM_H */
