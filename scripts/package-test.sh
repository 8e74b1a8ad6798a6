#!/usr/bin/env bash
# package-test: build the deb and the rpm, and prove them (docs/packaging.md).
#
# 1. Builds both packages twice from one snapshot of the tree: the current
#    version, and a "next" one (version +pkgtest2, with one extra Alembic
#    revision) to upgrade to.
# 2. deb: in a fresh Debian bookworm root (mmdebstrap minbase + python3,
#    python3-venv, procps and systemd, cached in .cache/debroot-base, an
#    overlay per run), inside a network namespace with only loopback (so the
#    package installs without a network): dpkg -i; appliance --version and
#    config check; systemd-analyze verify and security on the installed unit;
#    appliance serve started in a chroot with the unit's command line, user
#    and empty capability set; TLS forward exchanges with ack; SIGHUP reload;
#    a user, a shared key and a client certificate. Then the root boots with
#    systemd-nspawn: the real unit starts at boot (sandboxed, seccomp, no
#    capabilities), systemctl reload, the upgrade to the next build under
#    the running service (migrations run, restart on the new environment;
#    data, users, keys and certificates survive; the changed config is
#    kept), a port below 1024 through the generator, systemctl stop. Remove
#    keeps the data, purge deletes them.
# 3. rpm: rpm -qpi/-qpl/--scripts; rpm --root into an empty root (files,
#    modes, config flags); then with its scriptlets into another overlay of
#    the Debian root: install, upgrade, erase.
#
# Needs root (chroot, mounts, namespaces), Debian's mmdebstrap, rpm, systemd
# and systemd-container packages (installed with apt-get when missing), and
# the project's .venv (the forward client uses its msgpack). KEEP=1 keeps the
# work folder.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF="$ROOT/scripts/package-test.sh"
BASE_CACHE=${PACKAGE_TEST_CACHE:-$ROOT/.cache}
BASE=$BASE_CACHE/debroot-base
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_PACKAGES="python3 python3-venv procps systemd"
BASE_RECIPE="mmdebstrap minbase $SUITE; $BASE_PACKAGES; v1"
VENV_PY=$ROOT/.venv/bin/python
CLIENT=$ROOT/packaging/test/forward_client.py

# -- reporting --------------------------------------------------------------------------
T0=${PACKAGE_TEST_T0:-$(date +%s)}
export PACKAGE_TEST_T0=$T0
step() { printf '\n== package-test [%3ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
ok() {
    printf 'ok   %s\n' "$*"
    printf '%s\n' "$*" >>"$WORK/passed"
}
fail() {
    printf 'FAIL %s\n' "$*" >&2
    exit 1
}
# check DESCRIPTION COMMAND...: run it, show its output only when it fails.
check() {
    local what=$1 output
    shift
    if output=$("$@" 2>&1); then
        ok "$what"
    else
        printf '%s\n' "$output" >&2
        fail "$what"
    fi
}

# eventually DESCRIPTION COMMAND...: like check, retrying for up to 15 s.
eventually() {
    local what=$1 i
    shift
    for i in $(seq 150); do
        if "$@" >/dev/null 2>&1; then
            ok "$what"
            return
        fi
        [ "$i" -lt 150 ] && sleep 0.1
    done
    check "$what" "$@"
}

# -- inside the Debian root ----------------------------------------------------------------
PATH_ROOT=/usr/sbin:/usr/bin:/sbin:/bin
# in_root COMMAND...: run in the root as root, with a clean environment.
in_root() { chroot "$R" env -i PATH=$PATH_ROOT LC_ALL=C.UTF-8 HOME=/root "$@"; }

# mount_root: inside the phase's mount namespace, the root is an overlay on
# the cached base (a copy where overlayfs is not allowed), with /proc,
# /dev/shm and /run of its own. Everything goes when the namespace ends.
mount_root() {
    local name
    name=$(basename "$R")
    mkdir -p "$R" "$WORK/$name.upper" "$WORK/$name.work"
    if ! mount -t overlay overlay \
        -o "lowerdir=$BASE,upperdir=$WORK/$name.upper,workdir=$WORK/$name.work" "$R" 2>/dev/null; then
        cp -a "$BASE/." "$R/"
    fi
    mount_extras
}

# /proc, /dev/shm and /run of the root, for chroot (systemd-nspawn makes its own).
mount_extras() {
    mount -t proc proc "$R/proc"
    mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
    mount -t tmpfs -o mode=0755 tmpfs "$R/run"
}

# The service exactly as the unit runs it: ExecStart, User=, Environment=,
# WorkingDirectory=, UMask=, NoNewPrivileges=, CapabilityBoundingSet= and
# AmbientCapabilities= (empty unless capability arguments for setpriv are given).
# service_command [SETPRIV_CAPABILITY_ARGS...]: sets SERVICE_COMMAND.
service_command() {
    local unit exec_start user workdir umask_value env_args caps
    unit="$R/lib/systemd/system/appliance.service"
    exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
    user=$(sed -n 's/^User=//p' "$unit")
    workdir=$(sed -n 's/^WorkingDirectory=//p' "$unit")
    umask_value=$(sed -n 's/^UMask=//p' "$unit")
    mapfile -t env_args < <(sed -n 's/^Environment=//p' "$unit")
    [ -n "$exec_start" ] && [ -n "$user" ] || fail "no ExecStart= or User= in $unit"
    caps=(--bounding-set=-all --inh-caps=-all)
    [ $# -gt 0 ] && caps=("$@")
    SERVICE_COMMAND=(chroot "$R" env -i "PATH=$PATH_ROOT" LC_ALL=C.UTF-8 HOME="$workdir"
        "${env_args[@]}" setpriv --reuid="$user" --regid="$user" --init-groups --no-new-privs
        "${caps[@]}" -- sh -c "cd $workdir && umask $umask_value && exec $exec_start")
}

# start_service LOG [SETPRIV_CAPABILITY_ARGS...]: start it, wait until it is ready.
start_service() {
    local log=$1 waited=0
    shift
    service_command "$@"
    "${SERVICE_COMMAND[@]}" >"$log" 2>&1 &
    SERVICE_PID=$!
    until grep -qs 'event=service.ready' "$log"; do
        if ! kill -0 "$SERVICE_PID" 2>/dev/null; then
            cat "$log" >&2
            fail "appliance serve exited at start"
        fi
        [ $waited -lt 600 ] || fail "appliance serve not ready after 60 s"
        sleep 0.1
        waited=$((waited + 1))
    done
}

stop_service() { # SIGTERM, as systemctl stop; the service must exit 0
    local log=$1 rc=0
    kill -TERM "$SERVICE_PID"
    wait "$SERVICE_PID" || rc=$?
    if [ $rc -ne 0 ] || ! grep -q 'event=service.stopped' "$log"; then
        cat "$log" >&2
        fail "appliance serve did not stop cleanly on SIGTERM (exit $rc)"
    fi
    ok "SIGTERM: graceful stop, exit 0"
}

# send PORT EVENTS [client args...]: a TLS forward exchange with ack; prints the JSON result.
send() {
    local port=$1 events=$2
    shift 2
    "$VENV_PY" "$CLIENT" --port "$port" --ca "$R/var/lib/appliance/pki/ca.pem" \
        --events "$events" --run "$RUN_ID" "$@"
}

rows() { # rows in the events table, read from outside the root
    # os._exit: skip the interpreter's teardown, where the Rust runtime may abort noisily.
    "$VENV_PY" -c 'import os, sys; from deltalake import DeltaTable
print(DeltaTable(sys.argv[1]).to_pyarrow_table().num_rows, flush=True); os._exit(0)' \
        "$R/var/lib/appliance/lake/events"
}

# wait_rows N: with ack = "wal" (the default) an ack means the write-ahead log
# holds the events and the table gets them at the next commit (commit_interval_seconds),
# so a count taken right after an ack may be short. Poll until the table holds N rows.
wait_rows() {
    local want=$1 deadline=$((SECONDS + 60)) have
    until have=$(rows) && [ "$have" = "$want" ]; do
        [ $SECONDS -lt $deadline ] || fail "the table holds $have rows, not $want, 60 s after the acks"
        sleep 0.2
    done
}

sqlite_query() { # sqlite_query SQL: against the root's auth database
    "$VENV_PY" -c 'import sqlite3, sys
con = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print("\n".join("|".join(map(str, row)) for row in con.execute(sys.argv[2])))' \
        "$R/var/lib/appliance/auth/auth.db" "$1"
}

# Everything an upgrade must keep, one line each.
state_fingerprint() {
    local pki=$R/var/lib/appliance/pki
    echo "ca.pem $(sha256sum <"$pki/ca.pem" | cut -c1-64)"
    echo "ca.key $(sha256sum <"$pki/ca.key" | cut -c1-64)"
    echo "server.pem $(sha256sum <"$pki/server.pem" | cut -c1-64)"
    echo "secret.key $(sha256sum <"$R/var/lib/appliance/auth/secret.key" | cut -c1-64)"
    echo "node-id $(cat "$R/var/lib/appliance/node-id")"
    echo "rows $(rows)"
    echo "users $(as_admin appliance user list --json | "$VENV_PY" -c \
        'import json, sys; print(sorted(u["name"] for u in json.load(sys.stdin)))')"
    echo "keys $(as_admin appliance key list --json | "$VENV_PY" -c \
        'import json, sys; print(sorted(k["name"] for k in json.load(sys.stdin)))')"
    echo "certs $(as_admin appliance cert list --json | "$VENV_PY" -c \
        'import json, sys; print(sorted(f"{c['"'"'serial'"'"']}:{c['"'"'status'"'"']}" for c in json.load(sys.stdin)))')"
}

# boot_container: systemd-nspawn boots the root (systemd as its PID 1) in this
# phase's network namespace; sets INIT (its PID 1, for nsenter).
boot_container() {
    umount "$R/proc" "$R/dev/shm" "$R/run"
    systemd-nspawn --quiet --directory="$R" --boot --register=no --keep-unit --console=pipe \
        </dev/null >"$WORK/nspawn.log" 2>&1 &
    NSPAWN_PID=$!
    INIT=""
    local waited=0 state
    # nspawn's children come and go while it sets up: wait for a PID 1 that stays.
    until [ -n "$INIT" ] && nsenter -t "$INIT" -a true 2>/dev/null; do
        INIT=$(pgrep -P "$NSPAWN_PID" -x systemd || true)
        if ! kill -0 "$NSPAWN_PID" 2>/dev/null; then
            cat "$WORK/nspawn.log" >&2
            fail "systemd-nspawn exited"
        fi
        [ $waited -lt 300 ] || fail "no systemd in the container after 30 s"
        sleep 0.1
        waited=$((waited + 1))
    done
    # Until PID 1 has its private bus, systemctl cannot connect: retry, then wait for the boot.
    waited=0
    until state=$(timeout 120 nsenter -t "$INIT" -a systemctl is-system-running --wait 2>&1) \
        || [ "$state" = degraded ] || ! grep -q 'Failed to connect to bus' <<<"$state"; do
        [ $waited -lt 300 ] || break
        sleep 0.1
        waited=$((waited + 1))
    done
    case "$state" in
        running) ok "systemd-nspawn: the root boots (systemd $state)" ;;
        degraded)
            in_container systemctl --failed --no-pager || true
            ok "systemd-nspawn: the root boots (systemd $state, see the failed units above)"
            ;;
        *)
            cat "$WORK/nspawn.log" >&2
            fail "the container did not boot: $state"
            ;;
    esac
}

in_container() { nsenter -t "$INIT" -a env -i "PATH=$PATH_ROOT" LC_ALL=C.UTF-8 HOME=/root "$@"; }

# as_admin COMMAND...: run in the root as root: in the booted container while
# there is one, else with chroot.
as_admin() {
    if [ -n "${INIT:-}" ]; then
        in_container "$@"
    else
        in_root "$@"
    fi
}

stop_container() {
    in_container systemctl poweroff >/dev/null 2>&1 || true
    local waited=0
    while kill -0 "$NSPAWN_PID" 2>/dev/null; do
        if [ $waited -ge 600 ]; then
            kill -KILL "$NSPAWN_PID"
            fail "the container did not power off in 60 s"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    wait "$NSPAWN_PID" || true
    INIT=""
    mount_extras
}

inner_deb() {
    R=$WORK/deb-root
    ip link set lo up
    # The host's /run stays out of reach (systemd-analyze and nspawn write there).
    mount -t tmpfs -o mode=0755 tmpfs /run
    mount_root
    local v1_deb v2_deb
    v1_deb=$(basename "$(cat "$WORK/v1/deb")")
    v2_deb=$(basename "$(cat "$WORK/v2/deb")")
    cp "$(cat "$WORK/v1/deb")" "$(cat "$WORK/v2/deb")" "$R/var/tmp/"
    check "no network in the namespace (only loopback)" \
        sh -c '! ip -o link show | grep -v " lo:" | grep -q .'

    step "deb: install $v1_deb (dpkg -i, no network)"
    if ! in_root dpkg -i "/var/tmp/$v1_deb" >"$WORK/dpkg-install.log" 2>&1; then
        cat "$WORK/dpkg-install.log" >&2
        fail "dpkg -i $v1_deb"
    fi
    cat "$WORK/dpkg-install.log"
    ok "dpkg -i $v1_deb installs with no network"
    check "postinst ran 'appliance db upgrade' (empty -> $V1_HEAD)" \
        grep -q "upgraded from (empty) to $V1_HEAD" "$WORK/dpkg-install.log"
    check "appliance is on PATH (/usr/bin/appliance)" \
        test "$(in_root sh -c 'command -v appliance')" = /usr/bin/appliance
    check "appliance --version = $V1" test "$(in_root appliance --version)" = "appliance $V1"
    check "user and group 'appliance' are system accounts" \
        sh -c "test \$(chroot '$R' id -u appliance) -lt 1000 && chroot '$R' getent group appliance"
    check "/var/lib/appliance is 0750 appliance:appliance" \
        test "$(in_root stat -c '%a %U:%G' /var/lib/appliance)" = "750 appliance:appliance"
    check "/etc/appliance/appliance.toml is 0640 root:appliance" \
        test "$(in_root stat -c '%a %U:%G' /etc/appliance/appliance.toml)" = "640 root:appliance"
    check "appliance.toml is a dpkg conffile" \
        grep -qx /etc/appliance/appliance.toml "$R/var/lib/dpkg/info/appliance.conffiles"
    check "the Grafana dashboard is installed and is JSON" \
        chroot "$R" python3 -c "import json; json.load(open('/usr/share/appliance/grafana/appliance.json'))"
    check "/opt/appliance/venv is the virtual environment built by postinst" \
        in_root test -x /opt/appliance/venv/bin/appliance
    check "the service is enabled (deb-systemd-helper)" \
        test -L "$R/etc/systemd/system/multi-user.target.wants/appliance.service"
    check "the auth database belongs to the service user, 0600" \
        test "$(in_root stat -c '%a %U' /var/lib/appliance/auth/auth.db)" = "600 appliance"
    check "appliance config check /etc/appliance/appliance.toml" \
        in_root appliance config check /etc/appliance/appliance.toml

    step "systemd: verify the unit (systemd-analyze, in the root)"
    local verify
    verify=$(systemd-analyze verify --root="$R" appliance.service 2>&1) \
        || fail "systemd-analyze verify: $verify"
    [ -z "$verify" ] || fail "systemd-analyze verify warns: $verify"
    ok "systemd-analyze verify appliance.service: no error, no warning"
    local exposure
    exposure=$(systemd-analyze security --root="$R" --offline=yes appliance.service 2>&1 \
        | sed -n 's/.*Overall exposure level for appliance.service: \([0-9.]*\).*/\1/p')
    check "systemd-analyze security: exposure $exposure (at most 2.0)" \
        awk -v e="$exposure" 'BEGIN { exit !(e != "" && e <= 2.0) }'
    local unit=$R/lib/systemd/system/appliance.service directive
    for directive in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
        ReadWritePaths=/var/lib/appliance CapabilityBoundingSet= AmbientCapabilities= \
        Restart=on-failure User=appliance "ExecReload=/bin/kill -HUP \$MAINPID"; do
        grep -qx -- "$directive" "$unit" || fail "the unit lacks $directive"
    done
    ok "the unit is hardened (NoNewPrivileges, ProtectSystem=strict, ProtectHome, PrivateTmp, ReadWritePaths, no capabilities)"
    check "the generator adds no capability for the shipped config" \
        sh -c "rm -rf '$R/tmp/gen' && chroot '$R' /lib/systemd/system-generators/appliance-generator /tmp/gen && ! test -e '$R/tmp/gen/appliance.service.d'"
    printf '[[listeners]]\nname = "syslog"\nbind = "0.0.0.0:514"\n' >"$R/tmp/low-port.toml"
    in_root env APPLIANCE_GENERATOR_CONFIG=/tmp/low-port.toml \
        /lib/systemd/system-generators/appliance-generator /tmp/gen
    check "the generator grants CAP_NET_BIND_SERVICE for port 514" \
        grep -qx 'AmbientCapabilities=CAP_NET_BIND_SERVICE' "$R/tmp/gen/appliance.service.d/50-low-port.conf"
    mkdir -p "$R/etc/systemd/system/appliance.service.d"
    cp "$R/tmp/gen/appliance.service.d/50-low-port.conf" "$R/etc/systemd/system/appliance.service.d/"
    verify=$(systemd-analyze verify --root="$R" appliance.service 2>&1) || true
    rm -rf "$R/etc/systemd/system/appliance.service.d"
    [ -z "$verify" ] || fail "systemd-analyze verify with the low-port drop-in: $verify"
    ok "systemd-analyze verify with the generated low-port drop-in"

    step "deb: serve with the unit's command line, TLS forward exchange with ack"
    start_service "$WORK/serve-v1.log"
    ok "appliance serve starts as User=appliance with no capabilities"
    check "the first start created the CA (0644) and its key (0600, appliance)" \
        test "$(in_root stat -c '%a %U' /var/lib/appliance/pki/ca.pem /var/lib/appliance/pki/ca.key | tr '\n' ' ')" = "644 appliance 600 appliance "
    local result first second
    result=$(send 24224 10 --tag pkg.v1) || fail "forward exchange on 127.0.0.1:24224"
    ok "TLS forward exchange with ack on 127.0.0.1:24224: $result"
    check "the service process runs as appliance with an empty capability set" \
        sh -c "grep -q '^Uid:.*\b$(chroot "$R" id -u appliance)\b' '$R/proc/$SERVICE_PID/status' && grep -q '^CapEff:.*0000000000000000' '$R/proc/$SERVICE_PID/status' && grep -q '^CapBnd:.*0000000000000000' '$R/proc/$SERVICE_PID/status'"
    first=$(printf '%s' "$result" | "$VENV_PY" -c 'import json, sys; print(json.load(sys.stdin)["server_cert_sha256"])')
    kill -HUP "$SERVICE_PID"
    local waited=0
    until grep -qs 'event=tls.reloaded.*trigger=SIGHUP' "$WORK/serve-v1.log"; do
        [ $waited -lt 100 ] || fail "no tls.reloaded after SIGHUP"
        sleep 0.1
        waited=$((waited + 1))
    done
    ok "SIGHUP (ExecReload) reloads the certificates"
    check "appliance cert rotate-server (signals the service itself)" \
        in_root appliance cert rotate-server
    sleep 0.5
    result=$(send 24224 5 --tag pkg.v1) || fail "forward exchange after rotate-server"
    second=$(printf '%s' "$result" | "$VENV_PY" -c 'import json, sys; print(json.load(sys.stdin)["server_cert_sha256"])')
    check "after the reload new connections get the new server certificate" test "$first" != "$second"
    stop_service "$WORK/serve-v1.log"
    check "the events are in the table (15 rows)" test "$(rows)" = 15

    step "deb: users, keys, client certificates; a listener that needs them"
    check "appliance user add alice (as root: runs as the service user)" \
        sh -c "printf '%s\n' '$PASSWORD' | chroot '$R' env -i PATH=$PATH_ROOT appliance user add alice --password-stdin"
    check "appliance key add pkgtest" \
        sh -c "printf '%s\n' '$SHARED_KEY' | chroot '$R' env -i PATH=$PATH_ROOT appliance key add pkgtest --secret-stdin"
    check "appliance cert issue-client web-01" \
        in_root appliance cert issue-client web-01 --org PackageTest --out /tmp/web-01
    check "state files stay owned by the service user" \
        sh -c "! chroot '$R' find /var/lib/appliance ! -user appliance | grep ."
    cat >>"$R/etc/appliance/appliance.toml" <<'EOF'

# Added by package-test: kept by dpkg across the upgrade.
[[listeners]]
protocol = "forward"
name = "forward-auth"
bind = "127.0.0.1:24225"
security = "users"
client_auth = "required"
EOF
    check "the changed config passes appliance config check" \
        in_root appliance config check /etc/appliance/appliance.toml
    start_service "$WORK/serve-v1b.log"
    export APPLIANCE_TEST_SHARED_KEY=$SHARED_KEY APPLIANCE_TEST_USER=alice
    result=$(APPLIANCE_TEST_PASSWORD=$PASSWORD send 24225 7 --tag pkg.auth --handshake \
        --cert "$R/tmp/web-01/web-01.pem") || fail "forward exchange with handshake and mTLS"
    ok "forward handshake (shared key, user alice) + client certificate web-01, ack: $result"
    if APPLIANCE_TEST_PASSWORD=wrong send 24225 1 --handshake --cert "$R/tmp/web-01/web-01.pem" \
        >/dev/null 2>&1; then
        fail "a wrong password was accepted"
    fi
    ok "a wrong password is refused"
    stop_service "$WORK/serve-v1b.log"

    step "systemd: boot the root with systemd-nspawn; the real unit"
    boot_container
    check "appliance.service was started at boot (enabled by postinst)" \
        in_container systemctl is-active --quiet appliance.service
    local pid status
    pid=$(in_container systemctl show --property=MainPID --value appliance.service)
    status=$(in_container cat "/proc/$pid/status")
    check "under systemd: uid appliance, no capabilities, no new privileges, seccomp filter" \
        sh -c "printf '%s\n' \"\$0\" | grep -q '^Uid:.*\b$(chroot "$R" id -u appliance)\b' &&
            printf '%s\n' \"\$0\" | grep -q '^CapEff:.*0000000000000000' &&
            printf '%s\n' \"\$0\" | grep -q '^CapBnd:.*0000000000000000' &&
            printf '%s\n' \"\$0\" | grep -q '^NoNewPrivs:.*1' &&
            printf '%s\n' \"\$0\" | grep -q '^Seccomp:.*2'" "$status"
    # Type=notify: "active" only after READY=1, which the service sends once its
    # listeners are open. The status text comes only through sd_notify, so it
    # proves the notification reached systemd; the exchange right after
    # proves "active" meant ready.
    check "the unit is Type=notify, NotifyAccess=main, WatchdogSec=20s" \
        test "$(in_container systemctl show --property=Type --value appliance.service) $(in_container systemctl show --property=NotifyAccess --value appliance.service) $(in_container systemctl show --property=WatchdogUSec --value appliance.service)" = "notify main 20s"
    eventually "under systemd: active (running) through READY=1 (StatusText from sd_notify)" \
        sh -c "nsenter -t $INIT -a systemctl show --property=StatusText --value appliance.service | grep -q '^listening: '"
    result=$(send 24224 3 --tag pkg.systemd) || {
        nsenter -t "$INIT" -a journalctl -u appliance.service -o cat --no-pager | tail -40 >&2
        fail "forward exchange with the systemd service"
    }
    ok "under systemd: TLS forward exchange with ack: $result"
    result=$(APPLIANCE_TEST_PASSWORD=$PASSWORD send 24225 4 --tag pkg.systemd.auth --handshake \
        --cert "$R/tmp/web-01/web-01.pem") || fail "handshake with the systemd service"
    ok "under systemd: forward handshake + client certificate, ack: $result"
    check "systemctl reload appliance" in_container systemctl reload appliance.service
    eventually "the reload re-read the certificates (journal: tls.reloaded trigger=SIGHUP)" \
        sh -c "nsenter -t $INIT -a journalctl -u appliance.service -o cat --no-pager | grep -q 'event=tls.reloaded.*trigger=SIGHUP'"
    step "systemd: the watchdog restarts a stopped event loop (SIGSTOP)"
    local stopped_pid restarted_pid
    stopped_pid=$(in_container systemctl show --property=MainPID --value appliance.service)
    in_container kill -STOP "$stopped_pid"
    # WatchdogSec=20s, then SIGABRT (with SIGCONT), then RestartSec=5s and READY=1.
    restarted_pid=""
    for _ in $(seq 900); do
        restarted_pid=$(nsenter -t "$INIT" -a systemctl show --property=MainPID --value appliance.service)
        if [ "$restarted_pid" != "$stopped_pid" ] && [ "$restarted_pid" != 0 ] &&
            nsenter -t "$INIT" -a systemctl is-active --quiet appliance.service; then
            break
        fi
        sleep 0.1
    done
    if [ "$restarted_pid" = "$stopped_pid" ] || [ "$restarted_pid" = 0 ]; then
        nsenter -t "$INIT" -a journalctl -u appliance.service --no-pager | tail -40 >&2
        fail "the watchdog did not restart the stopped service within 90 s"
    fi
    check "systemd logged a watchdog timeout for the stopped process" \
        sh -c "nsenter -t $INIT -a journalctl -u appliance.service --no-pager | grep -q 'Watchdog timeout'"
    ok "the watchdog killed pid $stopped_pid and systemd restarted the service as pid $restarted_pid (active through READY=1)"
    check "no core file was written (LimitCORE=0)" sh -c "! ls '$R/var/lib/appliance' | grep -q '^core'"
    result=$(send 24224 2 --tag pkg.watchdog) || {
        nsenter -t "$INIT" -a journalctl -u appliance.service -o cat --no-pager | tail -40 >&2
        fail "forward exchange after the watchdog restart"
    }
    ok "after the watchdog restart: TLS forward exchange with ack: $result"
    check "every acknowledged event reached the table (31 rows)" wait_rows 31
    state_fingerprint >"$WORK/state-before"
    sed 's/^/     /' "$WORK/state-before"

    step "deb: upgrade to $v2_deb while the service runs (dpkg -i under systemd, no network)"
    if ! in_container dpkg -i "/var/tmp/$v2_deb" >"$WORK/dpkg-upgrade.log" 2>&1; then
        cat "$WORK/dpkg-upgrade.log" >&2
        fail "dpkg -i $v2_deb"
    fi
    cat "$WORK/dpkg-upgrade.log"
    ok "dpkg -i $v2_deb upgrades with no network"
    check "postinst ran 'appliance db upgrade' ($V1_HEAD -> pkgtest_next)" \
        grep -q "upgraded from $V1_HEAD to pkgtest_next" "$WORK/dpkg-upgrade.log"
    check "appliance --version = $V2" test "$(as_admin appliance --version)" = "appliance $V2"
    local new_pid
    new_pid=$(in_container systemctl show --property=MainPID --value appliance.service)
    check "postinst restarted the service on the new virtual environment" \
        sh -c "test '$new_pid' != '$pid' && test '$new_pid' != 0 &&
            nsenter -t $INIT -a cat /proc/$new_pid/cmdline | tr '\\0' ' ' | grep -q '/opt/appliance/venvs/$V2_PKG\.'"
    check "the database is at the new head with the new table" \
        test "$(sqlite_query "select version_num from alembic_version") $(sqlite_query "select count(*) from sqlite_master where name = 'package_test_marker'")" = "pkgtest_next 1"
    check "only the new virtual environment is left" \
        test "$(find "$R/opt/appliance/venvs" -mindepth 1 -maxdepth 1 | wc -l)" = 1
    check "dpkg kept the changed config (conffile)" \
        grep -q 'name = "forward-auth"' "$R/etc/appliance/appliance.toml"
    state_fingerprint >"$WORK/state-after"
    if ! diff -u "$WORK/state-before" "$WORK/state-after" >&2; then
        fail "the upgrade changed the state"
    fi
    ok "CA, keys, node id, table rows, users, shared keys and certificates survived the upgrade"
    result=$(send 24224 2 --tag pkg.v2) || fail "forward exchange after the upgrade"
    ok "after the upgrade: TLS forward exchange with ack: $result"
    result=$(APPLIANCE_TEST_PASSWORD=$PASSWORD send 24225 2 --tag pkg.v2.auth --handshake \
        --cert "$R/tmp/web-01/web-01.pem") || fail "handshake after the upgrade"
    ok "after the upgrade: user alice, key pkgtest and certificate web-01 (from $V1) still admit: $result"

    step "systemd: a port below 1024 (the generator's drop-in), stop"
    sed -i 's/^bind = "127.0.0.1:24224"$/bind = "127.0.0.1:514"/' "$R/etc/appliance/appliance.toml"
    in_container systemctl daemon-reload
    check "daemon-reload ran appliance-generator: a low-port drop-in" \
        sh -c "nsenter -t $INIT -a systemctl show --property=DropInPaths --value appliance.service | grep -q 50-low-port.conf"
    in_container systemctl restart appliance.service
    pid=$(in_container systemctl show --property=MainPID --value appliance.service)
    check "with the drop-in the service has CAP_NET_BIND_SERVICE and nothing else" \
        sh -c "nsenter -t $INIT -a cat /proc/$pid/status | grep -q '^CapEff:.*0000000000000400'"
    result=$(send 514 1 --tag pkg.low) || fail "forward exchange on port 514"
    ok "under systemd: port 514, ack: $result"
    sed -i 's/^bind = "127.0.0.1:514"$/bind = "127.0.0.1:24224"/' "$R/etc/appliance/appliance.toml"
    in_container systemctl daemon-reload
    check "back on port 24224 after daemon-reload: no drop-in" \
        sh -c "! nsenter -t $INIT -a systemctl show --property=DropInPaths --value appliance.service | grep -q 50-low-port.conf"
    check "systemctl stop appliance" in_container systemctl stop appliance.service
    check "the service is inactive" sh -c "! nsenter -t $INIT -a systemctl is-active --quiet appliance.service"
    eventually "it stopped gracefully (journal: service.stopped)" \
        sh -c "nsenter -t $INIT -a journalctl -u appliance.service -o cat --no-pager | grep -q 'event=service.stopped'"
    stop_container
    check "the table holds every acknowledged event (36 rows)" test "$(rows)" = 36

    step "deb: a low port without the capability, remove, purge"
    sed -i 's/^bind = "127.0.0.1:24224"$/bind = "127.0.0.1:514"/' "$R/etc/appliance/appliance.toml"
    service_command
    if timeout 60 "${SERVICE_COMMAND[@]}" >"$WORK/serve-low-denied.log" 2>&1; then
        fail "port 514 was bound with an empty capability set"
    fi
    check "port 514 with the unit's empty capability set: refused (Permission denied)" \
        grep -q 'Permission denied' "$WORK/serve-low-denied.log"
    sed -i 's/^bind = "127.0.0.1:514"$/bind = "127.0.0.1:24224"/' "$R/etc/appliance/appliance.toml"

    in_root dpkg -r appliance >"$WORK/dpkg-remove.log" 2>&1 || {
        cat "$WORK/dpkg-remove.log" >&2
        fail "dpkg -r appliance"
    }
    check "remove: the program and its virtual environments are gone" \
        sh -c "! test -e '$R/opt/appliance' && ! test -e '$R/usr/bin/appliance'"
    check "remove: the data stay (/var/lib/appliance: table, PKI, auth database)" \
        sh -c "test -f '$R/var/lib/appliance/pki/ca.key' && test -f '$R/var/lib/appliance/auth/auth.db' && test -d '$R/var/lib/appliance/lake/events/_delta_log'"
    check "remove: the config and the user stay" \
        sh -c "test -f '$R/etc/appliance/appliance.toml' && chroot '$R' id appliance"
    in_root dpkg -P appliance >"$WORK/dpkg-purge.log" 2>&1 || {
        cat "$WORK/dpkg-purge.log" >&2
        fail "dpkg -P appliance"
    }
    check "purge: /var/lib/appliance and /etc/appliance are deleted" \
        sh -c "! test -e '$R/var/lib/appliance' && ! test -e '$R/etc/appliance'"
    check "purge: the unit is no longer enabled" \
        sh -c "! test -e '$R/etc/systemd/system/multi-user.target.wants/appliance.service'"
}

inner_rpm() {
    R=$WORK/rpm-root
    mount -t tmpfs -o mode=0755 tmpfs /run
    mount_root
    local v1_rpm v2_rpm
    v1_rpm=$(cat "$WORK/v1/rpm")
    v2_rpm=$(cat "$WORK/v2/rpm")

    step "rpm: inspect $(basename "$v1_rpm")"
    rpm -qpi "$v1_rpm"
    local files scripts
    files=$(rpm -qpl "$v1_rpm")
    for path in /usr/bin/appliance /etc/appliance/appliance.toml /opt/appliance/requirements.txt \
        /usr/lib/systemd/system/appliance.service /usr/lib/sysusers.d/appliance.conf \
        /usr/lib/systemd/system-generators/appliance-generator; do
        grep -qx "$path" <<<"$files" || fail "rpm -qpl: $path is missing"
    done
    grep -q "^/opt/appliance/wheels/appliance-$V1-py3-none-any.whl$" <<<"$files" \
        || fail "rpm -qpl: no appliance wheel"
    grep -q '^/opt/appliance/wheels/pyarrow-' <<<"$files" || fail "rpm -qpl: no pyarrow wheel"
    ok "rpm -qpl: command, config, unit, generator, sysusers, wheels ($(grep -c '\.whl$' <<<"$files"))"
    check "rpm -qpi: name appliance, version $V1_PKG" \
        test "$(rpm -qp --qf '%{NAME} %{VERSION}' "$v1_rpm")" = "appliance $V1_PKG"
    check "rpm: appliance.toml is %config(noreplace)" \
        sh -c "rpm -qp --qf '[%{FILENAMES} %{FILEFLAGS:fflags}\n]' '$v1_rpm' | grep -qx '/etc/appliance/appliance.toml cn'"
    check "rpm: requires python(abi) = 3.11" \
        sh -c "rpm -qpR '$v1_rpm' | grep -qx 'python(abi) = 3.11'"
    scripts=$(rpm -qp --scripts "$v1_rpm")
    for want in "preinstall scriptlet" "useradd --system" "postinstall scriptlet" \
        "db upgrade" "--no-index" "preuninstall scriptlet" "postuninstall scriptlet"; do
        grep -qF -- "$want" <<<"$scripts" || fail "rpm --scripts: no '$want'"
    done
    ok "rpm -qp --scripts: %pre creates the user, %post installs offline and migrates, %preun, %postun"

    step "rpm: rpm --root into an empty root"
    local empty=$WORK/rpm-empty
    mkdir -p "$empty"
    rpm --root "$empty" --initdb
    check "rpm --root EMPTY -i --nodeps --noscripts" \
        rpm --root "$empty" -i --nodeps --noscripts "$v1_rpm"
    check "rpm --root EMPTY -V appliance: files as packaged" rpm --root "$empty" -V --nodeps appliance
    check "files and modes: /usr/bin/appliance 755, appliance.toml 640, unit 644, /etc/appliance 750" \
        test "$(stat -c '%a' "$empty/usr/bin/appliance" "$empty/etc/appliance/appliance.toml" \
            "$empty/usr/lib/systemd/system/appliance.service" "$empty/etc/appliance" | tr '\n' ' ')" \
        = "755 640 644 750 "
    check "the wheels match requirements.txt" sh -c "test \$(grep -c sha256 '$empty/opt/appliance/requirements.txt') -eq \$(ls '$empty/opt/appliance/wheels' | grep -vc '^pip-')"

    step "rpm: scriptlets for real, in an overlay of the Debian root (install, upgrade, erase)"
    rpm --root "$R" --initdb
    if ! rpm --root "$R" -i --nodeps "$v1_rpm" >"$WORK/rpm-install.log" 2>&1; then
        cat "$WORK/rpm-install.log" >&2
        fail "rpm -i $(basename "$v1_rpm")"
    fi
    cat "$WORK/rpm-install.log"
    ok "rpm -i: %pre and %post ran"
    check "rpm %post: appliance --version = $V1, db upgraded to $V1_HEAD" \
        sh -c "test \"\$(chroot '$R' appliance --version)\" = 'appliance $V1' && grep -q 'to $V1_HEAD' '$WORK/rpm-install.log'"
    check "rpm %pre: user appliance; state dir 0750" \
        test "$(in_root stat -c '%a %U' /var/lib/appliance)" = "750 appliance"
    check "rpm: appliance user add bob" \
        sh -c "printf 'pw-bob\n' | chroot '$R' env -i PATH=$PATH_ROOT appliance user add bob --password-stdin"
    if ! rpm --root "$R" -U --nodeps "$v2_rpm" >"$WORK/rpm-upgrade.log" 2>&1; then
        cat "$WORK/rpm-upgrade.log" >&2
        fail "rpm -U $(basename "$v2_rpm")"
    fi
    cat "$WORK/rpm-upgrade.log"
    check "rpm -U: appliance --version = $V2, db upgraded to pkgtest_next" \
        sh -c "test \"\$(chroot '$R' appliance --version)\" = 'appliance $V2' && grep -q 'upgraded from $V1_HEAD to pkgtest_next' '$WORK/rpm-upgrade.log'"
    check "rpm -U: the old package's %preun/%postun left the new environment alone" \
        sh -c "chroot '$R' test -x /opt/appliance/venv/bin/appliance && test \$(ls '$R/opt/appliance/venvs' | wc -l) = 1"
    check "rpm -U: user bob survived" \
        sh -c "chroot '$R' env -i PATH=$PATH_ROOT appliance user list | grep -q '^bob '"
    check "rpm -e appliance" rpm --root "$R" -e --nodeps appliance
    check "rpm -e: virtual environments gone, data and user kept" \
        sh -c "! test -e '$R/opt/appliance' && test -f '$R/var/lib/appliance/auth/auth.db' && chroot '$R' id appliance"
}

# -- the orchestration ------------------------------------------------------------------------
ensure_host_tools() {
    local missing=()
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    command -v rpm >/dev/null || missing+=(rpm)
    command -v systemd-analyze >/dev/null || missing+=(systemd)
    command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
    command -v unshare >/dev/null || missing+=(util-linux)
    if [ ${#missing[@]} -gt 0 ]; then
        step "installing ${missing[*]} (apt-get)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
}

# The cached Debian root: mmdebstrap (Debian's faster debootstrap) minbase
# plus the package's dependencies, from Debian with the network; rebuilt when
# the recipe changes. PACKAGE_TEST_CACHE moves it out of .cache/.
ensure_base_root() {
    mkdir -p "$BASE_CACHE"
    exec 9>"$BASE_CACHE/debroot.lock"
    flock 9
    if [ -f "$BASE/.package-test-recipe" ] && [ "$(cat "$BASE/.package-test-recipe")" = "$BASE_RECIPE" ]; then
        return
    fi
    step "building the Debian $SUITE root in $BASE (cached for later runs)"
    rm -rf "$BASE" "$BASE.new"
    mkdir -p "$BASE.new"
    if ! mmdebstrap --mode=root --variant=minbase --include="${BASE_PACKAGES// /,}" \
        "$SUITE" "$BASE.new" "$MIRROR" >"$BASE_CACHE/mmdebstrap.log" 2>&1; then
        tail -20 "$BASE_CACHE/mmdebstrap.log" >&2
        fail "mmdebstrap $SUITE"
    fi
    : >"$BASE.new/etc/resolv.conf"
    echo "$BASE_RECIPE" >"$BASE.new/.package-test-recipe"
    mv "$BASE.new" "$BASE"
}

cleanup() {
    local rc=$?
    if [ -n "${WORK:-}" ] && [ -d "$WORK" ]; then
        local passed=0
        [ -f "$WORK/passed" ] && passed=$(wc -l <"$WORK/passed")
        echo
        if [ $rc -eq 0 ]; then
            echo "package-test: $passed passed, 0 failed ($(($(date +%s) - T0)) s)"
        else
            echo "package-test: $passed passed, 1 failed ($(($(date +%s) - T0)) s; work folder: $WORK)"
        fi
        if [ $rc -eq 0 ] && [ -z "${KEEP:-}" ]; then
            rm -rf "$WORK"
        fi
    fi
    exit $rc
}

main() {
    [ "$(id -u)" = 0 ] || fail "package-test needs root (chroot, mounts, namespaces)"
    [ -x "$VENV_PY" ] || fail "no $VENV_PY: run 'make env' first"
    ensure_host_tools
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/appliance-package-test.XXXXXX")
    export WORK
    trap cleanup EXIT
    : >"$WORK/passed"

    step "building the packages (current and next version) from one snapshot of the tree"
    mkdir -p "$WORK/src" "$WORK/overlay/migrations/versions" "$WORK/v1" "$WORK/v2"
    (cd "$ROOT" && tar cf - --exclude=__pycache__ --exclude='*.egg-info' \
        pyproject.toml README.md appliance auth pki migrations) | tar xf - -C "$WORK/src"
    V1=$(sed -n -E 's/^__version__ = "(.*)"$/\1/p' "$WORK/src/appliance/__init__.py")
    case "$V1" in
        *+*) V2="$V1.pkgtest2" ;;
        *) V2="$V1+pkgtest2" ;;
    esac
    V1_HEAD=$("$VENV_PY" -c 'import sys
from alembic.script import ScriptDirectory
print(ScriptDirectory(sys.argv[1]).get_current_head())' "$WORK/src/migrations")
    # The next build's extra revision: proves that an upgrade runs the migrations.
    cat >"$WORK/overlay/migrations/versions/9999_package_test.py" <<EOF
"""package-test only: a revision in the "next" build, so that the upgrade has one to run."""

import sqlalchemy as sa
from alembic import op

revision = "pkgtest_next"
down_revision = "$V1_HEAD"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("package_test_marker", sa.Column("id", sa.Integer, primary_key=True))


def downgrade() -> None:
    op.drop_table("package_test_marker")
EOF
    "$ROOT/scripts/package-build.sh" --source "$WORK/src" --out "$WORK/v1" >"$WORK/v1/paths"
    "$ROOT/scripts/package-build.sh" --source "$WORK/src" --out "$WORK/v2" --version "$V2" \
        --overlay "$WORK/overlay" >"$WORK/v2/paths"
    for v in v1 v2; do
        sed -n 1p "$WORK/$v/paths" >"$WORK/$v/deb"
        sed -n 2p "$WORK/$v/paths" >"$WORK/$v/rpm"
    done
    V1_PKG=$(rpm -qp --qf '%{VERSION}' "$(cat "$WORK/v1/rpm")")
    V2_PKG=$(rpm -qp --qf '%{VERSION}' "$(cat "$WORK/v2/rpm")")
    ok "built $(basename "$(cat "$WORK/v1/deb")") $(basename "$(cat "$WORK/v1/rpm")") and the $V2 pair"
    ls -l "$WORK"/v1/*.deb "$WORK"/v1/*.rpm "$WORK"/v2/*.deb "$WORK"/v2/*.rpm

    ensure_base_root

    export V1 V2 V1_HEAD V1_PKG V2_PKG RUN_ID="run-$$"
    export SHARED_KEY="pkgtest-shared-$RANDOM$RANDOM" PASSWORD="pkgtest-pw-$RANDOM$RANDOM"
    # Each phase in its own mount, network (loopback only) and PID namespaces:
    # mounts and processes end with it.
    # The rpm phase runs beside the deb phase (2 cores, both mostly wait on one).
    unshare --mount --net --pid --fork --mount-proc --kill-child -- bash "$SELF" --inner-rpm \
        >"$WORK/rpm-phase.log" 2>&1 &
    local rpm_pid=$! deb_rc=0 rpm_rc=0
    unshare --mount --net --pid --fork --mount-proc --kill-child -- bash "$SELF" --inner-deb || deb_rc=$?
    wait "$rpm_pid" || rpm_rc=$?
    cat "$WORK/rpm-phase.log"
    [ $deb_rc -eq 0 ] || fail "the deb phase failed (see above)"
    [ $rpm_rc -eq 0 ] || fail "the rpm phase failed (see above)"
}

case "${1:-}" in
    --inner-deb) inner_deb ;;
    --inner-rpm) inner_rpm ;;
    "") main ;;
    *) echo "usage: $0" >&2; exit 2 ;;
esac
