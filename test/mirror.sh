# test/mirror.sh — which Debian mirror the chroots (test/chroot.sh) and the
# source build (test/pg15src.sh) download from; sourced by both.
#
#   idem_mirror      prints the mirror:
#                    1. $IDEM_MIRROR, when set (the override);
#                    2. else the first Debian archive this machine's apt
#                       already uses: /etc/apt/sources.list, then the files
#                       of /etc/apt/sources.list.d (one-line *.list and
#                       deb822 *.sources, in apt's order), the first "deb"
#                       entry, enabled, with a Debian suite (bookworm,
#                       trixie, sid, stable, ... and their -updates and
#                       -backports; not -security) and component main;
#                    2. else http://deb.debian.org/debian.
#   apt_debian_uri DIR   step 2 alone, for the apt directory DIR (default
#                    /etc/apt; $IDEM_APT_ETC); prints nothing when none fits
#
# A local mirror or caching proxy in the machine's sources is thus used for
# the chroots too.  It must carry every suite a chroot needs (bookworm for
# 15, trixie for 17, sid for 18); if it does not, set IDEM_MIRROR.

IDEM_DEFAULT_MIRROR=http://deb.debian.org/debian

apt_debian_uri() {
	local etc=${1:-${IDEM_APT_ETC:-/etc/apt}} f
	local files=()
	[ -f "$etc/sources.list" ] && files+=("$etc/sources.list")
	for f in "$etc"/sources.list.d/*; do
		case $f in *.list | *.sources) [ -f "$f" ] && files+=("$f") ;; esac
	done
	[ ${#files[@]} -gt 0 ] || return 0
	awk '
	function debian_suite(s) {
		return s ~ /^(buster|bullseye|bookworm|trixie|forky|duke|sid|stable|oldstable|oldoldstable|testing|unstable|experimental)(-updates|-backports|-backports-sloppy|-proposed-updates)?$/
	}
	function usable(uri) { return uri ~ /^(https?|ftp|file):/ && uri !~ /debian-security/ }
	function found(uri) { sub(/\/+$/, "", uri); print uri; done = 1; exit }
	function has_main(list,   n, a, i) {
		n = split(list, a, /[ \t]+/)
		for (i = 1; i <= n; i++) if (a[i] == "main") return 1
		return 0
	}
	# a deb822 paragraph of a .sources file, ended by a blank line or the file
	function paragraph(   n, t, u, s, i, j, is_deb) {
		if (enabled ~ /^(no|false|0)$/) return
		n = split(types, t, /[ \t]+/)
		is_deb = 0
		for (i = 1; i <= n; i++) if (t[i] == "deb") is_deb = 1
		if (!is_deb || !has_main(components)) return
		n = split(suites, s, /[ \t]+/)
		for (i = 1; i <= n; i++) if (debian_suite(s[i])) break
		if (i > n) return
		n = split(uris, u, /[ \t]+/)
		for (j = 1; j <= n; j++) if (usable(u[j])) found(u[j])
	}
	function reset() { types = uris = suites = components = enabled = ""; field = "" }
	FNR == 1 { if (deb822) paragraph(); reset(); deb822 = (FILENAME ~ /\.sources$/) }
	deb822 {
		if ($0 ~ /^[ \t]*#/) next
		if ($0 ~ /^[ \t]*$/) { paragraph(); reset(); next }
		if ($0 ~ /^[ \t]/) {	# a continuation line of the field before
			line = $0; sub(/^[ \t]+/, "", line)
			if (field == "uris") uris = uris " " line
			else if (field == "suites") suites = suites " " line
			else if (field == "components") components = components " " line
			else if (field == "types") types = types " " line
			next
		}
		name = tolower($0); sub(/:.*/, "", name)
		value = $0; sub(/^[^:]*:[ \t]*/, "", value); sub(/[ \t]+$/, "", value)
		field = name
		if (name == "types") types = value
		else if (name == "uris") uris = value
		else if (name == "suites") suites = value
		else if (name == "components") components = value
		else if (name == "enabled") enabled = tolower(value)
		next
	}
	{	# one-line format: deb [options] uri suite component...
		line = $0
		sub(/#.*/, "", line)
		gsub(/\[[^]]*\]/, " ", line)
		n = split(line, w, /[ \t]+/)
		k = (w[1] == "") ? 2 : 1
		if (w[k] != "deb" || n < k + 3) next
		comps = ""
		for (i = k + 3; i <= n; i++) comps = comps " " w[i]
		if (debian_suite(w[k + 2]) && has_main(comps) && usable(w[k + 1])) found(w[k + 1])
	}
	END { if (!done && deb822) paragraph() }
	' "${files[@]}" 2>/dev/null | head -n 1
}

idem_mirror() {
	if [ -n "${IDEM_MIRROR:-}" ]; then
		echo "${IDEM_MIRROR%/}"
		return 0
	fi
	local uri
	uri=$(apt_debian_uri) || uri=
	echo "${uri:-$IDEM_DEFAULT_MIRROR}"
}
