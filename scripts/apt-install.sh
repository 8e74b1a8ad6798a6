#!/usr/bin/env bash
# Installs Debian packages a test needs, when missing: the shared part of
# scripts/go-interop-deps.sh and scripts/haproxy-deps.sh.
#
#   scripts/apt-install.sh NAME PACKAGE...   NAME prefixes every message
#
# Idempotent and quiet: apt-get runs only when a package is not installed,
# and then "apt-get update" once before the install; apt's output is shown
# only when the install fails. Services a package would start are not
# started (policy-rc.d): the tests run what they need themselves.
#
# Exit: 0 installed (or already there; "NAME: installed ..." on stderr when
# something was installed); 1 could not install (not root, apt failed);
# 2 the Debian archive is not reachable (or this system has no apt-get),
# printed on stderr: callers may skip on 2 only.
set -euo pipefail

[[ $# -ge 2 ]] || { echo "usage: $0 NAME PACKAGE..." >&2; exit 1; }
name=$1
shift

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for package in "$@"; do
        installed "$package" || missing+=("$package")
    done
else
    missing=("$@")
fi
[[ ${#missing[@]} -eq 0 ]] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "$name: apt-get not found: cannot install ${missing[*]}" >&2
    exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "$name: ${missing[*]} not installed and installing needs root" >&2
    exit 1
fi
log=$(mktemp)
policy=/usr/sbin/policy-rc.d
made_policy=0
cleanup() {
    rm -f "$log"
    if [[ $made_policy -eq 1 ]]; then rm -f "$policy"; fi
}
trap cleanup EXIT
if [[ ! -e $policy ]]; then
    # Exit 101 tells invoke-rc.d not to start the package's service.
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    made_policy=1
fi
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-q -o DPkg::Lock::Timeout=300)
echo "$name: installing ${missing[*]} from the Debian packages" >&2
# "apt-get update" may exit 0 with warnings when a mirror is down: judge
# reachability from its output, and only when the install itself fails.
update_rc=0
apt-get "${apt_opts[@]}" update >"$log" 2>&1 || update_rc=$?
if ! apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    if grep -Eqi 'Temporary failure resolving|Could not resolve|Failed to fetch|Unable to connect|Network is unreachable|Connection (refused|timed out)' "$log"; then
        echo "$name: the Debian archive is not reachable (apt-get update exit $update_rc)" >&2
        exit 2
    fi
    echo "$name: apt-get install ${missing[*]} failed" >&2
    exit 1
fi
echo "$name: installed ${missing[*]}" >&2
