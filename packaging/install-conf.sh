#!/bin/sh
# packaging/install-conf.sh SRC DEST — meson's install script for the
# configuration: copies SRC to $DESTDIR/DEST (mode 0644) unless a file is
# already there. `meson install` must never overwrite an operator's
# /etc/bertd/bertd.conf; a staged install (DESTDIR empty dir) always gets it.
set -eu
src=$1 dest=${DESTDIR:-}$2
if [ -e "$dest" ]; then
	echo "install-conf: $dest exists, left as it is (the shipped one: $src)"
	exit 0
fi
[ -n "${MESON_INSTALL_DRY_RUN:-}" ] && { echo "install-conf: would install $dest"; exit 0; }
install -D -m 0644 "$src" "$dest"
echo "Installing $src to $dest"
