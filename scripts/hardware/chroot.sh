#!/usr/bin/env bash
# scripts/hardware.sh chroot [--bundle DIR] [--root DIR] [--out DIR] [--budget S]:
# the proof, without a GPU, that the bundle needs nothing of ours on the
# machine: a bare Debian made with `debootstrap --variant=minbase` (kept in
# build-chroot/, made once) gets the source tree and the bundle bind-mounted
# and runs `scripts/hardware.sh run` inside, with no python, no compiler,
# none of scripts/setup.sh's packages. The stages that need a GPU or torch
# must skip saying so, the rest must pass, and the library check must find
# nothing missing. Needs root (chroot, mounts) and Debian's archive.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=hw-bundle root=build-chroot out=build-chroot-out budget=600
while [ $# -gt 0 ]; do
  case $1 in
    --bundle) bundle=$2; shift 2 ;;
    --root) root=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    *) echo "hardware.sh chroot: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "hardware.sh chroot: needs root (chroot and bind mounts)" >&2; exit 2; }
[ -f "$bundle/manifest.txt" ] || { echo "hardware.sh chroot: no bundle at $bundle (scripts/hardware.sh pack)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "hardware.sh chroot: needs debootstrap (scripts/setup.sh installs it)" >&2; exit 2; }
mirror=${ECCL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ ! -e "$root/.eccl-minbase" ]; then
  rm -rf "$root"
  echo "chroot: debootstrap --variant=minbase bookworm $root ($mirror)"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
    { tail -20 "$root.debootstrap.log"; exit 1; }
  touch "$root/.eccl-minbase"
fi
echo "chroot: $root holds $(chroot "$root" dpkg-query -W | wc -l) packages (minbase); of setup.sh's:" \
  "$(chroot "$root" dpkg-query -W libfmt9 libhwloc15 libisal2 libssl3 python3 cmake 2>/dev/null | wc -l)"
src=$(pwd -P) bundle=$(cd "$bundle" && pwd -P)
mkdir -p "$out"
out=$(cd "$out" && pwd -P)
case $bundle in "$src"/*) inner_bundle=/src/${bundle#"$src"/} ;; *) echo "chroot: the bundle must be inside the tree" >&2; exit 2 ;; esac
# Mounts live in a mount namespace of their own: they end with it.
unshare --mount --propagation private bash -euo pipefail -c '
  root=$1 src=$2 out=$3
  mkdir -p "$root/src" "$root/out" "$root/proc" "$root/sys" "$root/dev"
  mount --bind "$src" "$root/src"
  mount --bind "$out" "$root/out"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o size=2g tmpfs "$root/dev/shm"
  mount -t tmpfs tmpfs "$root/tmp"
  shift 3
  exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp /bin/bash -c \
    "cd /src && scripts/hardware.sh run --bundle $1 --out /out --budget $2"
' chroot "$root" "$src" "$out" "$inner_bundle" "$budget" && rc=0 || rc=$?
echo "chroot: run exited $rc; $out/report.md:"
sed -n '/^| stage/,/^$/p' "$out/report.md"
# Without a GPU: the GPU and torch stages must say why they skipped, and
# every other stage must pass.
bad=$(awk -F'|' '/^\| [a-z_]+ \|/ && $2 !~ /^ stage / && $3 !~ /passed|skipped: no GPU|skipped: no python3/ {print $2}' "$out/report.md" | xargs)
[ "$rc" -eq 0 ] && [ -z "$bad" ] || { echo "chroot: not as expected: ${bad:-run failed}"; exit 1; }
echo "chroot: the bundle runs in a bare Debian: GPU stages skipped with their reason, the rest passed"
