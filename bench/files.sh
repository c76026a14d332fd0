#!/usr/bin/env bash
# bench/files.sh — the files of src/ a request passes through, traced.
#
#   bash bench/files.sh        (as root, or a user who may ptrace the server)
#
# Starts a throwaway cluster with the library preloaded.  For each kind of
# request it opens a session, makes one warm-up call (plan caches, the
# extension's owner and the key secret loaded), then attaches gdb to the
# session's backend with a breakpoint on every function of idempotency.so
# that logs its caller and continues, and runs the request once.  Prints per
# kind the files visited in order, the calls into our functions (those not
# inlined, the commit callbacks included), the calls that cross into another
# file, and those that come back into a file already visited: the counts of
# src/README.md, "The path of a request".  Invalidations of the relcache that
# arrive meanwhile (cache.c's callback and the callbacks it runs) are left
# out and counted.
set -u
cd "$(dirname "$0")/.." || exit 2
. test/cluster.sh
command -v gdb >/dev/null || { apt-get update -qq && apt-get install -y -qq gdb >/dev/null; }
bench_start "shared_preload_libraries = 'idempotency'" "idempotency.purge_interval = 0"
SO=$(${PG_CONFIG:-pg_config} --pkglibdir)/idempotency.so
psql -qX -v ON_ERROR_STOP=1 >/dev/null <<'EOF' || exit 2
CREATE EXTENSION idempotency;
CREATE TABLE payment (key text PRIMARY KEY, amount int);
SELECT idempotency.create_topic('t');
EOF

cat >"$WORK/trace.py" <<'EOF'
import gdb, os
log = open(os.environ['TRACE_OUT'], 'w')
names = [l.split()[-1] for l in os.popen("nm --defined-only " + os.environ['TRACE_SO'])
         if l.split()[1] in 'Tt' and not l.split()[-1].startswith('_')]

def where(fr):
    try:
        sal = fr.find_sal()
        return (os.path.basename(sal.symtab.filename) if sal.symtab else '?', fr.name())
    except Exception:
        return ('?', '?')

class Logged(gdb.Breakpoint):
    def stop(self):
        f = gdb.newest_frame()
        depth, x, inval = 0, f, 0
        while x is not None:
            if depth > 0 and x.name() == 'relcache_inval':
                inval = 1
            depth, x = depth + 1, x.older()
        cf, cn = where(f.older())
        tf, tn = where(f)
        log.write(f"{depth}\t{cf}\t{cn}\t{tf}\t{tn}\t{inval}\n")
        log.flush()
        return False

gdb.execute('set pagination off')
for n in names:
    if n != 'Pg_magic_func':
        Logged(n, internal=True)
open(os.environ['TRACE_OUT'] + '.ready', 'w').close()
EOF

cat >"$WORK/count.py" <<'EOF'
import sys
visited, stack = [], {}
calls = cross = back = inval = 0
for line in open(sys.argv[1]):
    d, cf, cn, tf, tn, inside = line.rstrip('\n').split('\t')
    d = int(d)
    if inside == '1':                   # called by an invalidation's callback
        continue
    if tn == 'relcache_inval':          # cache.c, for a change made elsewhere
        inval += 1
        continue
    if cf == '?':                       # called by the server: an entry point
        stack[d] = tf
        if tf not in visited:
            visited.append(tf)
        continue
    if cf.endswith('.h'):               # an inline function of a header
        cf = stack.get(d - 2, stack.get(d - 1, cf))
    if tf.endswith('.h'):
        stack[d] = cf
        continue
    stack[d] = tf
    calls += 1
    if tf != cf:
        cross += 1
        if tf in visited:
            back += 1
        else:
            visited.append(tf)
print(f"{len(visited)} files, {calls} calls, {cross} crossing into another file, "
      f"{back} back into one already visited: {' '.join(visited)}"
      + (f" ({inval} relcache invalidations not counted)" if inval else ""))
EOF

# trace KIND WARMUP REQUEST: one session, the warm-up, then the request traced
trace() {
	local kind=$1 out="$WORK/$1.trace" fifo="$WORK/$1.fifo" res="$WORK/$1.out" pid gp
	mkfifo "$fifo"
	psql -X -At <"$fifo" >"$res" 2>&1 &
	exec 3>"$fifo"
	echo "SELECT pg_backend_pid();" >&3
	echo "$2" >&3
	echo "\\echo warm-done" >&3
	until grep -q warm-done "$res"; do sleep 0.2; done
	pid=$(head -n 1 "$res")
	TRACE_OUT=$out TRACE_SO=$SO gdb -q -batch -p "$pid" -x "$WORK/trace.py" -ex continue \
		>"$WORK/$kind.gdb" 2>&1 &
	gp=$!
	until [ -e "$out.ready" ]; do sleep 0.2; done
	sleep 1
	echo "$3" >&3
	echo "\\echo traced-done" >&3
	until grep -q traced-done "$res"; do sleep 0.2; done
	kill -INT "$gp"
	wait "$gp"
	exec 3>&-
	wait
	printf '%-14s %s\n' "$kind:" "$(python3 "$WORK/count.py" "$out")"
}
ONCE="SELECT outcome FROM idempotency.once(\$k\$%s\$k\$, '{}', 'INSERT INTO payment VALUES (\$1, 1)', \$k\$%s\$k\$);"
# shellcheck disable=SC2059
trace once-new "$(printf "$ONCE" w1 w1)" "$(printf "$ONCE" k1 k1)"
# shellcheck disable=SC2059
trace once-replay "$(printf "$ONCE" w2 w2)" "$(printf "$ONCE" k1 k1)"
trace publish "SELECT idempotency.publish('t', '{}', 'mk0');" "SELECT idempotency.publish('t', '{}', 'mk1');"
trace claim "SELECT idempotency.publish('t', '{}');" "SELECT claim, id FROM idempotency.claim('t', 1) \\gset"
trace ack "SELECT claim, id FROM idempotency.claim('t', 1) \\gset" "SELECT idempotency.ack(:'claim', ARRAY[:id]::int8[]);"
