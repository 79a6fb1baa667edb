# tests/package_lib.sh — sourced by package_deb.sh and systemd_pid1.sh: the
# Debian package of this tree and a clean Debian 12 root to install it in,
# both made once and reused (the package from BUILD/package/build-usr, a
# --prefix=/usr build of the product targets only; the root cached as a
# tarball under BUILD/package keyed by what it holds, so only a first run
# downloads). The sourcing script defines skip() and fail(). It must never
# touch the host's /etc, users or services.

# pkg_deb SRC BUILD WORK: builds the package(s) into WORK/deb; sets PKG_DEB
# (bertd_*.deb) and PKG_CDEB (bertd-cuda_*.deb, or "" when BUILD's worker is
# not a CUDA build).
pkg_deb() {
	local src=$1 build=$2 work=$3
	local pbuild=$work/build-usr
	if [ ! -f "$pbuild/build.ninja" ]; then
		# CC from the environment (ccache) as for BUILD; CPU only, no tests built.
		meson setup "$pbuild" "$src" --prefix=/usr -Dcuda=disabled -Dwerror=false -Dshared_data=none \
			>"$work/setup.log" 2>&1 || fail "meson setup of $pbuild: $(tail -n 5 "$work/setup.log")"
	fi
	local cuda_arg=() needed
	# (whole outputs in variables, then grep: with pipefail, grep -q ending a
	# pipe early makes the writer's SIGPIPE the pipe's status)
	needed=$(readelf -d "$build/worker/bertd-worker" 2>/dev/null || true)
	if grep -q 'NEEDED.*libcudart\.' <<<"$needed"; then
		cuda_arg=(--cuda-worker "$build/worker/bertd-worker")
	fi
	rm -rf "$work/deb"
	"$src/packaging/deb/mkdeb" --build "$pbuild" --out "$work/deb" "${cuda_arg[@]}" >"$work/mkdeb.log" 2>&1 ||
		fail "mkdeb: $(tail -n 20 "$work/mkdeb.log")"
	PKG_DEB=$(ls "$work"/deb/bertd_*.deb)
	PKG_CDEB=$(ls "$work"/deb/bertd-cuda_*.deb 2>/dev/null)
}

# pkg_root_tar WORK DEB [EXTRA]: sets PKG_TAR to a tarball of a Debian 12
# minbase root holding DEB's dependencies (made with mmdebstrap on first
# use), plus, with EXTRA, the packages it names (comma-separated), added to
# a copy of that root with apt-get (about 20 s where a second mmdebstrap
# takes 2 minutes; the base root is package_deb's). Skips (77) when
# the mirror BERTD_DEBIAN_MIRROR (default http://deb.debian.org/debian)
# is needed and cannot be reached. Older tarballs of the same EXTRA are
# removed.
pkg_root_tar() {
	local work=$1 deb=$2 extra=${3:-}
	local mirror=${BERTD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
	# Depends: "libc6 (>= 2.34), libjansson4 (>= 2.14), ..., passwd": the names
	# (the first of each alternative).
	local deps
	deps=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed -e 's/|.*//' -e 's/(.*)//' -e 's/[[:space:]]//g' |
		sed '/^$/d' | sort -u | paste -sd, -)
	local key flavour=""
	if [ -n "$extra" ]; then
		pkg_root_tar "$work" "$deb"
		local base=$PKG_TAR
		flavour=-$(printf '%s' "$extra" | tr -c 'a-z0-9\n' '-' | cut -c1-32)
		key=$(printf '%s+%s' "${base##*/}" "$extra" | sha256sum | cut -c1-16)
	else
		key=$(printf '%s' "$deps" | sha256sum | cut -c1-16)
	fi
	PKG_TAR=$work/root-bookworm$flavour-$key.tar
	[ -f "$PKG_TAR" ] && return 0
	curl -sSf --max-time 15 -o /dev/null "$mirror/dists/bookworm/Release" 2>/dev/null ||
		skip "no Debian 12 root cached ($PKG_TAR) and $mirror cannot be reached to make one"
	if [ -n "$extra" ]; then
		echo "making the Debian 12 root ${PKG_TAR##*/}: ${base##*/} + $extra (apt-get from $mirror)"
		local tmp=$work/layer$flavour
		rm -rf --one-file-system "$tmp"
		mkdir -p "$tmp"
		tar -C "$tmp" -xf "$base" || fail "unpacking $base"
		cp -L /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null
		# shellcheck disable=SC2016
		unshare --mount --fork sh -c 'mount -t proc proc "$1/proc" && chroot "$1" apt-get -q update &&
			DEBIAN_FRONTEND=noninteractive chroot "$1" apt-get -q -y --no-install-recommends install $2 &&
			chroot "$1" apt-get clean' sh "$tmp" "${extra//,/ }" >"$work/apt$flavour.log" 2>&1 ||
			fail "apt-get install $extra: $(tail -n 20 "$work/apt$flavour.log")"
		rm -rf "$tmp"/var/lib/apt/lists/* "$tmp/etc/resolv.conf"
		tar -C "$tmp" -cf "$PKG_TAR.part" . || fail "packing $PKG_TAR"
		rm -rf --one-file-system "$tmp"
	else
		echo "making the Debian 12 root (minbase + $deps) from $mirror"
		mmdebstrap --quiet --variant=minbase --format=tar --include="$deps" bookworm "$PKG_TAR.part" "$mirror" \
			>"$work/mmdebstrap.log" 2>&1 || fail "mmdebstrap: $(tail -n 20 "$work/mmdebstrap.log")"
	fi
	mv "$PKG_TAR.part" "$PKG_TAR"
	# older roots of this flavour (other dependency lists) only take space
	find "$work" -maxdepth 1 -name "root-bookworm$flavour-????????????????.tar" ! -name "${PKG_TAR##*/}" -delete
}

# The installed daemon at URL prepares dataset "licenses" from the data
# root's common-licenses/ with the packaged BERT vocab, and it ends ready
# (polled for at most 10 minutes). Uses the caller's api (curl with its
# token) and fail.
pkg_dataset_licenses() { # url
	local url=$1 state=""
	api -H 'Content-Type: application/json' "$url/v1/datasets" \
		-d '{"name": "licenses", "source": "common-licenses/", "vocab": {"file": "bert-base-uncased-vocab.txt"}}' >/dev/null
	for _ in $(seq 1200); do
		state=$(api "$url/v1/datasets/licenses" | jq -r .state)
		case $state in queued|preparing) sleep 0.5 ;; *) break ;; esac
	done
	[ "$state" = ready ] || fail "dataset licenses: $(api "$url/v1/datasets/licenses")"
}
