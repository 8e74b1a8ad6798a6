#!/bin/sh
# appliance package: deb postinst (configure [OLD-VERSION], abort-*) and
# rpm %post (1: install, 2 or more: upgrade).
#
# 1. the 'appliance' user and the state directory /var/lib/appliance (0750);
# 2. a new virtual environment under /opt/appliance/venvs/, built from the
#    wheels the package carries (no network: --no-index, hashes checked),
#    then /opt/appliance/venv is switched to it in one rename;
# 3. 'appliance db upgrade': the auth database's migrations, as the service
#    user (APPLIANCE_SKIP_DB_UPGRADE=1 skips it, e.g. when a shared
#    PostgreSQL database cannot be reached during the upgrade);
# 4. systemd: deb enables and starts the service on a first install; rpm
#    follows the presets; an upgrade restarts a running service;
# 5. the previous virtual environments are removed.
set -e

prefix=/opt/appliance
state=/var/lib/appliance
etc=/etc/appliance
user=appliance
unit=appliance.service
# APPLIANCE_VERSION, APPLIANCE_PYTHONS (the Python versions the wheels are for)
. "$prefix/build-info"

case "${1:-}" in
    configure)
        format=deb
        if [ -n "${2:-}" ]; then first=no; else first=yes; fi
        ;;
    abort-upgrade | abort-remove | abort-deconfigure)
        exit 0
        ;;
    [0-9]*)
        format=rpm
        if [ "$1" -le 1 ]; then first=yes; else first=no; fi
        ;;
    *)
        echo "appliance postinst: unknown argument '${1:-}'" >&2
        exit 1
        ;;
esac

# Maintainer scripts inherit the caller's environment (PIP_*, PYTHON*): not here.
clean_env() {
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 HOME="${home:-/root}" "$@"
}

# 1. user, group and state directory -------------------------------------------
if ! getent passwd "$user" >/dev/null; then
    # preinst/%pre creates it; this covers an install made with --noscripts.
    getent group "$user" >/dev/null || groupadd --system "$user"
    useradd --system --gid "$user" --home-dir "$state" --no-create-home \
        --shell /usr/sbin/nologin --comment "appliance log ingest" "$user"
fi
mkdir -p "$state"
chown "$user:$user" "$state"
chmod 0750 "$state"

statoverride() {
    [ "$format" = deb ] && command -v dpkg-statoverride >/dev/null \
        && dpkg-statoverride --list "$1" >/dev/null 2>&1
}
# The config may hold a database password: root writes it, the service reads it.
if ! statoverride "$etc"; then
    chown "root:$user" "$etc"
    chmod 0750 "$etc"
fi
if [ -f "$etc/appliance.toml" ] && ! statoverride "$etc/appliance.toml"; then
    chown "root:$user" "$etc/appliance.toml"
    chmod 0640 "$etc/appliance.toml"
fi

# 2. the virtual environment ----------------------------------------------------
python=""
for version in $APPLIANCE_PYTHONS; do
    if [ -x "/usr/bin/python$version" ]; then
        python="/usr/bin/python$version"
        break
    fi
done
if [ -z "$python" ]; then
    echo "appliance: no /usr/bin/python<X.Y> for X.Y in: $APPLIANCE_PYTHONS" >&2
    echo "appliance: the packaged wheels need one of these Python versions" >&2
    exit 1
fi
pip_wheel=$(ls "$prefix"/wheels/pip-*.whl | head -n 1)

mkdir -p "$prefix/venvs"
new=$(mktemp -d "$prefix/venvs/$APPLIANCE_VERSION.XXXXXX")
chmod 0755 "$new"
echo "appliance: installing $APPLIANCE_VERSION into $new ($python, no network)"
if ! clean_env "$python" -m venv --without-pip "$new" \
    || ! clean_env "$new/bin/python" "$pip_wheel/pip" install --isolated --quiet \
        --no-index --find-links "$prefix/wheels" --only-binary :all: \
        --require-hashes --no-deps --no-cache-dir --disable-pip-version-check \
        --no-warn-script-location -r "$prefix/requirements.txt" \
    || ! clean_env "$new/bin/python" "$pip_wheel/pip" check --isolated \
        --disable-pip-version-check >/dev/null; then
    rm -rf "$new"
    echo "appliance: building the virtual environment failed" >&2
    exit 1
fi
ln -sfn "$new" "$prefix/venv.new"
mv -Tf "$prefix/venv.new" "$prefix/venv"

# 3. database migrations ----------------------------------------------------------
if [ -n "${APPLIANCE_SKIP_DB_UPGRADE:-}" ]; then
    echo "appliance: APPLIANCE_SKIP_DB_UPGRADE is set: run 'appliance db upgrade' yourself"
else
    echo "appliance: appliance db upgrade"
    if ! (cd "$state" && home="$state" clean_env setpriv --reuid="$user" --regid="$user" --init-groups -- \
        "$prefix/venv/bin/appliance" db upgrade --config "$etc/appliance.toml"); then
        echo "appliance: the auth database migration failed: fix the cause (see above)," >&2
        echo "appliance: then run 'appliance db upgrade' and start the service" >&2
        exit 1
    fi
fi

# 4. systemd --------------------------------------------------------------------
if [ "$format" = deb ] && command -v deb-systemd-helper >/dev/null; then
    deb-systemd-helper unmask "$unit" >/dev/null || true
    # was-enabled is true for a new installation: enable it then.
    if deb-systemd-helper --quiet was-enabled "$unit"; then
        deb-systemd-helper enable "$unit" >/dev/null || true
    else
        deb-systemd-helper update-state "$unit" >/dev/null || true
    fi
elif [ "$format" = rpm ] && [ "$first" = yes ]; then
    systemctl --no-reload preset "$unit" >/dev/null 2>&1 || true
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
    if [ "$first" = no ]; then
        systemctl try-restart "$unit" \
            || echo "appliance: restart failed: systemctl status $unit" >&2
    elif [ "$format" = deb ]; then
        deb-systemd-invoke start "$unit" \
            || echo "appliance: start failed: systemctl status $unit" >&2
    fi
fi

# 5. previous virtual environments ------------------------------------------------
current=$(readlink -f "$prefix/venv")
for old in "$prefix"/venvs/*; do
    if [ -d "$old" ] && [ "$old" != "$current" ]; then
        rm -rf "$old"
    fi
done
exit 0
