# test/steps.sh — run steps that each end with a closing line
# "N passed, M failed" (test/run's), and sum them.  Source it, then:
#
#   step LABEL CMD...    run CMD, stream its output, and count its last closing
#                        line; a step without one counts as one test, passed
#                        when CMD exits 0; a step that exits non-zero without
#                        a failure in its closing line counts one failure more
#                        (only steps whose label matches $STEPS_ONLY, a
#                        grep -E pattern, when it is set)
#   steps_summary        one line per step (label, counts, seconds), then the
#                        summed closing line, last; returns non-zero on any
#                        failure
#
#   steps_group NAME FUNC
#                        run FUNC (which calls step) in the background, its
#                        output into a log; steps_join prints each group's
#                        log when it ends and adds its steps to this shell's
#                        (the machine's cores then serve two chains of steps:
#                        CI's time is the longer chain, not the sum)
#
# Used by test/matrix (make test-all) and .ci/run.
STEPS_PASSED=0
STEPS_FAILED=0
STEPS_LINES=()

step() {
	local label=$1 log rc line p=0 f=0 t0=$SECONDS
	shift
	[ -n "${STEPS_ONLY:-}" ] && ! grep -qE -- "$STEPS_ONLY" <<<"$label" && return 0
	log=$(mktemp /tmp/idempotency-step.XXXXXX)
	echo "=== $label: $*"
	# make's "*** [target] Error" trailer is dropped: the closing line stays last
	"$@" 2>&1 | sed -u '/^make\(\[[0-9]*\]\)\{0,1\}: \*\*\* /d' | tee "$log"
	rc=${PIPESTATUS[0]}
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
	rm -f "$log"
	if [ -n "$line" ]; then
		p=${line%% passed*}
		f=${line#*, }
		f=${f%% failed}
	elif [ "$rc" -eq 0 ]; then
		p=1
	fi
	[ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
	STEPS_PASSED=$((STEPS_PASSED + p))
	STEPS_FAILED=$((STEPS_FAILED + f))
	STEPS_LINES+=("$(printf '%-34s %5d passed, %d failed  (%d s)' "$label:" "$p" "$f" $((SECONDS - t0)))")
	return 0
}

steps_summary() {
	echo "=== summary"
	printf '%s\n' "${STEPS_LINES[@]}"
	echo "$STEPS_PASSED passed, $STEPS_FAILED failed"
	[ "$STEPS_FAILED" -eq 0 ] && [ "$STEPS_PASSED" -gt 0 ]
}

STEPS_GROUPS=()
STEPS_GROUP_DIR=""
steps_group() {	# NAME FUNC
	local name=$1 fn=$2
	[ -n "$STEPS_GROUP_DIR" ] || STEPS_GROUP_DIR=$(mktemp -d /tmp/idempotency-steps.XXXXXX)
	(
		STEPS_PASSED=0 STEPS_FAILED=0 STEPS_LINES=()
		"$fn"
		echo "$STEPS_PASSED $STEPS_FAILED" >"$STEPS_GROUP_DIR/$name.count"
		printf '%s\n' "${STEPS_LINES[@]}" >"$STEPS_GROUP_DIR/$name.lines"
	) >"$STEPS_GROUP_DIR/$name.log" 2>&1 &
	STEPS_GROUPS+=("$name:$!")
}

steps_join() {
	local g name pid p f
	for g in "${STEPS_GROUPS[@]}"; do
		name=${g%%:*}
		pid=${g##*:}
		wait "$pid"
		echo "=== group $name (ran beside the steps above)"
		cat "$STEPS_GROUP_DIR/$name.log"
		if read -r p f <"$STEPS_GROUP_DIR/$name.count" 2>/dev/null; then
			STEPS_PASSED=$((STEPS_PASSED + p))
			STEPS_FAILED=$((STEPS_FAILED + f))
			mapfile -t -O "${#STEPS_LINES[@]}" STEPS_LINES <"$STEPS_GROUP_DIR/$name.lines"
		else
			STEPS_FAILED=$((STEPS_FAILED + 1))
			STEPS_LINES+=("group $name: ended without its counts")
		fi
	done
	STEPS_GROUPS=()
	[ -n "$STEPS_GROUP_DIR" ] && rm -rf "$STEPS_GROUP_DIR"
	STEPS_GROUP_DIR=""
}
