#!/bin/sh
# appliance package: deb postrm (remove|purge|upgrade|...) and rpm %postun
# (0: erase, 1 or more: upgrade).
#
# remove (rpm: erase): the virtual environments go; the data stay:
#   /var/lib/appliance (certificates, auth database, table), the user, and
#   the configuration (a deb conffile, an rpm %config(noreplace)).
# purge (deb only): the data go too: /var/lib/appliance and /etc/appliance.
#   The 'appliance' user stays (files restored from a backup may still
#   belong to its uid); 'userdel appliance' removes it.
set -e
prefix=/opt/appliance
unit=appliance.service

remove_venvs() {
    rm -rf "$prefix/venv" "$prefix/venv.new" "$prefix/venvs"
    rmdir "$prefix" 2>/dev/null || true
}

case "${1:-}" in
    remove | 0)
        remove_venvs
        if [ "$1" = remove ] && command -v deb-systemd-helper >/dev/null; then
            deb-systemd-helper mask "$unit" >/dev/null || true
        fi
        ;;
    purge)
        remove_venvs
        rm -rf /var/lib/appliance /etc/appliance
        if command -v deb-systemd-helper >/dev/null; then
            deb-systemd-helper purge "$unit" >/dev/null || true
            deb-systemd-helper unmask "$unit" >/dev/null || true
        fi
        ;;
    *)
        exit 0
        ;;
esac
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
