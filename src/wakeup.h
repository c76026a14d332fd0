/*-------------------------------------------------------------------------
 *
 * wakeup.h
 *	  The outbox's wake-ups (wakeup.c): what a publisher calls so that the
 *	  topic's relays wake when its transaction commits, through shared
 *	  memory (wait_for()) and, for a topic that asks for it, by NOTIFY.
 *
 *-------------------------------------------------------------------------
 */
#ifndef WAKEUP_H
#define WAKEUP_H

extern void idem_wakeup_init(void);
extern void idem_wake_at_commit(int32 topic_id, const char *topic, bool notify);

#endif							/* WAKEUP_H */
