#!/bin/sh
# /usr/bin/appliance, installed by the appliance package: the appliance CLI
# from its virtual environment (/opt/appliance/venv), with the packaged
# configuration as the default.
#
# State files must belong to the service user (0600, owned by it:
# docs/decisions.md#state-belongs-to-the-service-user), so when root runs a command that touches the state directory, the
# command runs as the 'appliance' user. Paths given to it (--out, --config)
# must then be readable or writable by that user. 'config check', --help and
# --version run as the caller. To run as root anyway (you then own the
# files): /opt/appliance/venv/bin/appliance.
set -u
venv=/opt/appliance/venv
user=appliance
if [ -z "${APPLIANCE_CONFIG:-}" ]; then
    APPLIANCE_CONFIG=/etc/appliance/appliance.toml
    export APPLIANCE_CONFIG
fi
if [ ! -x "$venv/bin/appliance" ]; then
    echo "appliance: $venv is missing: reinstall the appliance package" >&2
    exit 1
fi
if [ "$(id -u)" = 0 ] && id "$user" >/dev/null 2>&1; then
    # The subcommand may follow a global --config FILE (or --config=FILE).
    first="${1:-}"
    case "$first" in
        --config) first="${3:-}" ;;
        --config=*) first="${2:-}" ;;
    esac
    case "$first" in
        "" | -h | --help | --version | config) ;;
        *)
            exec setpriv --reuid="$user" --regid="$user" --init-groups -- \
                "$venv/bin/appliance" "$@"
            ;;
    esac
fi
exec "$venv/bin/appliance" "$@"
