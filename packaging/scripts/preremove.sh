#!/bin/sh
# appliance package: deb prerm (remove|upgrade|deconfigure|failed-upgrade)
# and rpm %preun (0: erase, 1 or more: upgrade).
#
# When the package goes away: stops the service, then removes the virtual
# environments (they are not package files). An upgrade leaves both: the new
# postinst builds a new environment and restarts the service on it.
set -e
unit=appliance.service

case "${1:-}" in
    remove | deconfigure) format=deb ;;
    0) format=rpm ;;
    *) exit 0 ;;
esac

if [ -d /run/systemd/system ]; then
    if [ "$format" = rpm ]; then
        systemctl --no-reload disable --now "$unit" >/dev/null 2>&1 || true
    else
        deb-systemd-invoke stop "$unit" >/dev/null 2>&1 || true
    fi
fi
if [ "$1" != deconfigure ]; then
    rm -rf /opt/appliance/venv /opt/appliance/venv.new /opt/appliance/venvs
fi
exit 0
