# demo/node.sh: part 6 of make demo (sourced by demo/run; test/docs/run
# checks what it prints when the install fails).
#
#   demo_node_install DIR   npm ci in DIR (demo/node: Express and node-postgres,
#                           locked to versions that run on Debian 12's Node 18)
#                           unless its node_modules is current; on failure sets
#                           skip_why (why) and skip_log (npm's output)
#   demo_skipped            prints "(skipped: $skip_why)" and the first and
#                           last lines of $skip_log (npm: the error code and
#                           the reason, then the log's path)

demo_node_install() {
	local dir=$1
	[ -f "$dir/node_modules/.package-lock.json" ] &&
		! [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ] && return 0
	# Node's own deprecation warnings (newer Node under npm) are left out:
	# the first lines shown are npm's error code and reason
	if ! skip_log=$(cd "$dir" && NODE_NO_WARNINGS=1 npm ci --no-audit --no-fund 2>&1); then
		skip_why="npm ci in $dir (Express and node-postgres from the npm registry) failed"
		skip_log=$(grep -v -e '^(node:[0-9]*) ' -e '^(Use `node --trace-' <<<"$skip_log" || true)
		return 1
	fi
	skip_log=""
}

demo_skipped() {
	echo "   (skipped: $skip_why)"
	[ -n "$skip_log" ] || return 0
	echo "   its output:"
	if [ "$(wc -l <<<"$skip_log")" -gt 14 ]; then
		{ head -n 5 <<<"$skip_log"; echo "..."; tail -n 8 <<<"$skip_log"; } | sed 's/^/     | /'
	else
		sed 's/^/     | /' <<<"$skip_log"
	fi
}
