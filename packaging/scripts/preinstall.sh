#!/bin/sh
# appliance package: deb preinst (install|upgrade|abort-upgrade) and
# rpm %pre (1: install, 2 or more: upgrade).
#
# Creates the system user and group 'appliance' the service runs as.
set -e

case "${1:-}" in
    abort-upgrade) exit 0 ;;
esac

user=appliance
if ! getent group "$user" >/dev/null; then
    groupadd --system "$user"
fi
if ! getent passwd "$user" >/dev/null; then
    nologin=/usr/sbin/nologin
    [ -x "$nologin" ] || nologin=/sbin/nologin
    useradd --system --gid "$user" --home-dir /var/lib/appliance --no-create-home \
        --shell "$nologin" --comment "appliance log ingest" "$user"
fi
exit 0
