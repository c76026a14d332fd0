#!/usr/bin/python3
"""bench/clients.py -- an application's view: requests from psycopg 3 (and
redis-py), for the scenarios pgbench cannot run (a Redis token) and for
per-request latency through bench/delay_proxy.py.

    clients.py SCENARIO CLIENTS (--seconds S | --count N) --pg DSN [--redis HOST:PORT] [--tag T]

Scenarios, each one new request with a fresh key, autocommit:
  bare1    INSERT ... RETURNING id                                  1 round trip
  once     SELECT ... FROM idempotency.once(key, NULL, 'INSERT ...', key, '10')   1
  guarded  BEGIN; begin(); INSERT; complete(); COMMIT               5
  redis    SET key 1 NX EX 86400 on Redis, then (if it was set) the INSERT   2
           (not atomic: a crash between the two loses the write or keeps a
           token without it)
Prints one line: "scenario clients requests tps median_ms p99_ms".
"""
import argparse
import multiprocessing
import os
import statistics
import sys
import time

import psycopg

INSERT = "INSERT INTO payment (key, amount) VALUES (%s, 10) RETURNING id"
ONCE = ("SELECT outcome, response FROM idempotency.once(%s, NULL, "
        "'INSERT INTO payment (key, amount) VALUES ($1, $2) RETURNING id', %s, '10')")


def worker(args, idx, out):
    conn = psycopg.connect(args.pg, autocommit=True)
    r = None
    if args.scenario == "redis":
        import redis
        host, port = args.redis.split(":")
        r = redis.Redis(host=host, port=int(port))
        r.ping()
    lat = []
    n = 0
    prefix = f"{args.tag}-{args.scenario}-{os.getpid()}-{idx}-"
    deadline = time.perf_counter() + args.seconds if args.seconds else None
    while True:
        if deadline is not None and time.perf_counter() >= deadline:
            break
        if deadline is None and n >= args.count:
            break
        key = prefix + str(n)
        t0 = time.perf_counter()
        if args.scenario == "bare1":
            conn.execute(INSERT, (key,)).fetchone()
        elif args.scenario == "once":
            conn.execute(ONCE, (key, key)).fetchone()
        elif args.scenario == "guarded":
            conn.execute("BEGIN")
            outcome = conn.execute("SELECT outcome FROM idempotency.begin(%s)", (key,)).fetchone()[0]
            if outcome != "replay":
                pid = conn.execute(INSERT, (key,)).fetchone()[0]
                conn.execute("SELECT idempotency.complete(%s, jsonb_build_object('id', %s::bigint))", (key, pid))
            conn.execute("COMMIT")
        elif args.scenario == "redis":
            if r.set(key, 1, nx=True, ex=86400):
                conn.execute(INSERT, (key,)).fetchone()
        lat.append(time.perf_counter() - t0)
        n += 1
    conn.close()
    out.put(lat)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["bare1", "once", "guarded", "redis"])
    p.add_argument("clients", type=int)
    p.add_argument("--seconds", type=float)
    p.add_argument("--count", type=int)
    p.add_argument("--pg", required=True)
    p.add_argument("--redis")
    p.add_argument("--tag", default="c")
    args = p.parse_args()
    if not args.seconds and not args.count:
        p.error("--seconds or --count")
    out = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=worker, args=(args, i, out)) for i in range(args.clients)]
    t0 = time.perf_counter()
    for pr in procs:
        pr.start()
    lat = []
    for _ in procs:
        lat.extend(out.get())
    for pr in procs:
        pr.join()
        if pr.exitcode != 0:
            sys.exit(f"a client failed (exit {pr.exitcode})")
    elapsed = args.seconds or (time.perf_counter() - t0)
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"{args.scenario} {args.clients} {len(lat)} {len(lat) / elapsed:.1f} "
          f"{statistics.median(lat) * 1000:.3f} {p99 * 1000:.3f}")


if __name__ == "__main__":
    main()
