#!/usr/bin/env bash
# Runs one command inside a throwaway VM that has a real kernel verbs
# provider (Soft-RoCE, rdma_rxe), so eccl's ibverbs code meets a real
# kernel RDMA stack on a machine without an HCA:
#
#   scripts/rdma-vm.sh [-t SECONDS] [-m MIB] [-n loop|pair] [-w DIR]... [--] COMMAND [ARG...]
#
# The guest is Debian's own kernel (package linux-image-amd64) under qemu.
# It sees this machine's whole file tree read-only over 9p with a throwaway
# tmpfs layer on top, so binaries built here run there unchanged; -w DIR
# shares DIR writable (results come back). It has no network device but the
# ones made inside it: -n loop (default) puts rxe0 on a dummy device (every
# process talks to rxe0, the kernel loops the packets), -n pair puts rxe0
# and rxe1 on the two ends of a veth pair (packets cross it; tc netem can
# impair it). The command runs as root in the current directory with the
# current exported environment plus ECCL_RDMA_VM=1, ECCL_RDMA_VM_DEV (and
# _DEV2), ECCL_RDMA_VM_IP (and _IP2), ECCL_RDMA_VM_NETDEV (and _NETDEV2).
#
# Exit status: the command's; 124 on timeout; 125 when the VM or its RDMA
# set-up failed (the guest's log is printed); 77 when this machine cannot
# run the VM at all (a package missing: the message names it), which ctest
# reads as a skip.
set -euo pipefail

timeout_s=600
memory_mib=6144  # four ranks of the collective suite need about 600 MiB each
net=loop
shares=()
while [ $# -gt 0 ]; do
  case $1 in
    -t) timeout_s=$2; shift 2 ;;
    -m) memory_mib=$2; shift 2 ;;
    -n) net=$2; shift 2 ;;
    -w) shares+=("$(cd "$2" && pwd)"); shift 2 ;;
    --) shift; break ;;
    -*) echo "rdma-vm: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [-t SECONDS] [-m MIB] [-n loop|pair] [-w DIR]... [--] COMMAND [ARG...]" >&2; exit 2; }
case $net in loop|pair) ;; *) echo "rdma-vm: -n loop or -n pair, not $net" >&2; exit 2 ;; esac

unusable() { echo "rdma-vm: cannot run the VM here: $*" >&2; exit 77; }
command -v qemu-system-x86_64 >/dev/null || unusable "qemu-system-x86_64 is missing (package qemu-system-x86)"
command -v cpio >/dev/null || unusable "cpio is missing (package cpio)"
command -v modprobe >/dev/null || unusable "modprobe is missing (package kmod)"
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || unusable "a static /bin/busybox is missing (package busybox-static)"
command -v rdma >/dev/null || unusable "the rdma tool is missing (package iproute2)"

# The newest installed kernel that ships rdma_rxe.
kernel="" kver=""
for k in $(ls -1v /boot/vmlinuz-* 2>/dev/null | tac); do
  v=${k#/boot/vmlinuz-}
  if find "/lib/modules/$v" -name 'rdma_rxe.ko*' 2>/dev/null | grep -q .; then kernel=$k kver=$v; break; fi
done
[ -n "$kernel" ] || unusable "no kernel in /boot with rdma_rxe (package linux-image-amd64)"

work=$(mktemp -d "${TMPDIR:-/tmp}/eccl-rdma-vm.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
xchg=$work/xchg
initrd=$work/initrd
mkdir -p "$xchg" "$initrd"/{bin,dev,proc,sys,host,root,layer,mods}

# The initramfs only mounts this machine's tree: busybox and the modules
# for virtio, 9p and overlayfs (uncompressed: busybox's insmod reads plain
# ELF), loaded in the order modprobe gives.
cp /bin/busybox "$initrd/bin/busybox"
: > "$initrd/mods/order"
for m in virtio_pci 9pnet_virtio 9p overlay; do
  modprobe -S "$kver" -D "$m" | while read -r verb path _; do
    [ "$verb" = insmod ] || continue
    name=$(basename "${path%%.ko*}").ko
    grep -qx "$name" "$initrd/mods/order" && continue
    case $path in
      *.ko.xz) xz -dc "$path" ;;
      *.ko.zst) zstd -qdc "$path" ;;
      *.ko.gz) gzip -dc "$path" ;;
      *) cat "$path" ;;
    esac > "$initrd/mods/$name"
    echo "$name" >> "$initrd/mods/order"
  done
done
{
  echo '#!/bin/busybox sh'
  echo '/bin/busybox --install -s /bin'
  echo 'mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev'
  echo 'exec </dev/console >/dev/console 2>&1'
  echo 'for m in $(cat /mods/order); do insmod /mods/$m || echo "eccl-rdma-vm: insmod $m failed"; done'
  echo 'o=trans=virtio,version=9p2000.L,msize=262144'
  echo 'mount -t 9p -o $o,ro,cache=loose host /host'
  echo 'mount -t tmpfs tmpfs /layer; mkdir -p /layer/up /layer/work'
  echo 'mount -t overlay overlay -o lowerdir=/host,upperdir=/layer/up,workdir=/layer/work /root'
  echo 'mount -t tmpfs tmpfs /root/run; mkdir -p /root/run/eccl-vm'
  echo 'mount -t 9p -o $o,cache=none xchg /root/run/eccl-vm'
  i=0
  for d in "${shares[@]}"; do
    echo "mount -t 9p -o \$o,cache=none share$i /root$d"
    i=$((i + 1))
  done
  echo 'umount /proc /sys; umount /dev'
  echo 'exec switch_root /root /bin/bash /run/eccl-vm/stage2.sh'
} > "$initrd/init"
chmod 755 "$initrd/init"
(cd "$initrd" && find . | cpio -o -H newc --quiet) > "$work/initrd.cpio"

# Stage two runs on the guest as PID 1, from this machine's tree: the
# kernel's RDMA modules, the devices, then the command.
cat > "$xchg/stage2.sh" <<'EOF'
x=/run/eccl-vm
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs -o mode=1777 tmpfs /dev/shm
exec </dev/null >>"$x/guest.log" 2>&1
off() { sync; echo o > /proc/sysrq-trigger; sleep 30; }
broken() { echo "set-up failed: $*"; echo "$*" > "$x/setup-failed"; off; }
. "$x/net"
# A device is ready when its port is ACTIVE and its IPv4 address has a GID.
ready() {
  local dev=$1 ip=$2 want g i
  printf -v want '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${ip//./ }
  for ((i = 0; i < 200; i++)); do
    if grep -q ACTIVE "/sys/class/infiniband/$dev/ports/1/state" 2>/dev/null; then
      for g in /sys/class/infiniband/$dev/ports/1/gids/*; do
        [ "$(cat "$g" 2>/dev/null)" = "$want" ] && return 0
      done
    fi
    sleep 0.05
  done
  broken "$dev did not come up with a GID for $ip"
}
ip link set lo up
if [ "$NET" = loop ]; then
  modprobe -a ib_uverbs rdma_rxe dummy || broken "modprobe ib_uverbs rdma_rxe dummy"
  ip link add rxenet0 type dummy && ip link set rxenet0 mtu 4200 up && ip addr add 169.254.77.1/16 dev rxenet0 ||
    broken "the dummy device"
  rdma link add rxe0 type rxe netdev rxenet0 || broken "rdma link add rxe0"
  ready rxe0 169.254.77.1
  export ECCL_RDMA_VM_DEV=rxe0 ECCL_RDMA_VM_IP=169.254.77.1 ECCL_RDMA_VM_NETDEV=rxenet0
else
  # Both ends are local addresses of one namespace: rules per outgoing
  # device send each end's packets over the veth instead of through lo.
  modprobe -a ib_uverbs rdma_rxe veth || broken "modprobe ib_uverbs rdma_rxe veth"
  ip link add rxenet0 type veth peer name rxenet1 || broken "the veth pair"
  for c in all default rxenet0 rxenet1; do
    echo 1 > /proc/sys/net/ipv4/conf/$c/accept_local; echo 0 > /proc/sys/net/ipv4/conf/$c/rp_filter
  done
  ip -batch - <<EOB || broken "the veth routes"
link set rxenet0 mtu 4200 up
link set rxenet1 mtu 4200 up
addr add 169.254.77.1/32 dev rxenet0
addr add 169.254.77.2/32 dev rxenet1
rule add pref 10 oif rxenet0 lookup 10
rule add pref 11 oif rxenet1 lookup 11
rule add pref 100 lookup local
rule del pref 0
route add 169.254.77.2 dev rxenet0 src 169.254.77.1 table 10
route add 169.254.77.1 dev rxenet1 src 169.254.77.2 table 11
EOB
  rdma link add rxe0 type rxe netdev rxenet0 && rdma link add rxe1 type rxe netdev rxenet1 || broken "rdma link add"
  ready rxe0 169.254.77.1
  ready rxe1 169.254.77.2
  export ECCL_RDMA_VM_DEV=rxe0 ECCL_RDMA_VM_IP=169.254.77.1 ECCL_RDMA_VM_NETDEV=rxenet0
  export ECCL_RDMA_VM_DEV2=rxe1 ECCL_RDMA_VM_IP2=169.254.77.2 ECCL_RDMA_VM_NETDEV2=rxenet1
fi
ulimit -l unlimited
export ECCL_RDMA_VM=1
: > "$x/started"
( . "$x/command.sh" ) >>"$x/stdout" 2>>"$x/stderr"
echo $? > "$x/rc"
off
EOF
echo "NET=$net" > "$xchg/net"
{
  while read -r name; do
    case $name in PWD|OLDPWD|SHLVL|_|ECCL_RDMA_VM*) continue ;; esac
    printf 'export %s=%q\n' "$name" "${!name}"
  done < <(compgen -e)
  printf 'cd %q || exit 125\nexec' "$PWD"
  printf ' %q' "$@"
  printf '\n'
} > "$xchg/command.sh"
: > "$xchg/stdout"
: > "$xchg/stderr"

fsdevs=(-virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap"
        -virtfs "local,path=$xchg,mount_tag=xchg,security_model=none,multidevs=remap")
i=0
for d in "${shares[@]}"; do
  fsdevs+=(-virtfs "local,path=$d,mount_tag=share$i,security_model=none,multidevs=remap")
  i=$((i + 1))
done
# TCG: this machine's /dev/kvm (kvm_pvm) cannot run a stock kernel.
# A boot seldom hangs before the command starts (seen once in CI: a
# loaded machine, nothing printed in 560 s); that is the VM's failure,
# not the command's, so a guest that has not started the command within
# ECCL_RDMA_VM_BOOT_S (default 180; idle it takes 5 s) is killed, its
# console shown, and booted once more in the time left.
boot_limit_s=${ECCL_RDMA_VM_BOOT_S:-180}
deadline=$((SECONDS + timeout_s))
fresh_exchange() {
  rm -f "$xchg/started" "$xchg/rc" "$xchg/setup-failed" "$xchg/guest.log"
  : > "$xchg/stdout"
  : > "$xchg/stderr"
}
boot() {
  timeout -k 5 "$1" qemu-system-x86_64 -machine pc -accel tcg -cpu max -smp 2 -m "$memory_mib" \
    -nographic -no-reboot -nic none -serial "file:$work/console.log" -monitor none \
    -kernel "$kernel" -initrd "$work/initrd.cpio" -append "console=ttyS0 panic=-1 quiet rdinit=/init" \
    "${fsdevs[@]}" > /dev/null 2>&1 &
}
guest_said() {
  # The firmware's terminal escapes would garble a CI log: text only.
  tail -20 "$work/console.log" | sed 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1b.//g' | tr -cd '[:print:]\n' >&2 || true
  echo >&2
  cat "$xchg/guest.log" >&2 2>/dev/null || true
}
# A pid that kill -0 reaches may be a zombie (qemu powered off, not yet
# reaped): alive means a state other than Z.
alive() { local stat; stat=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) && [ "$stat" != Z ]; }
for attempt in 1 2; do
  fresh_exchange
  boot "$((deadline - SECONDS))"
  vm=$!  # timeout's pid: it passes a TERM on to qemu
  boot_start=$SECONDS
  while alive "$vm" && [ ! -f "$xchg/started" ] && ((SECONDS - boot_start < boot_limit_s)); do
    sleep 0.5
  done
  if [ -f "$xchg/started" ] || ! alive "$vm"; then
    status=0
    wait "$vm" || status=$?
    break
  fi
  kill -TERM "$vm" 2>/dev/null || true
  wait "$vm" 2>/dev/null || true
  echo "rdma-vm: boot $attempt did not reach the command in ${boot_limit_s} s; its console ends:" >&2
  guest_said
  if ((attempt == 2 || deadline - SECONDS < 2 * boot_limit_s)); then
    echo "rdma-vm: giving up on the VM (${timeout_s} s in all)" >&2
    exit 125
  fi
done
cat "$xchg/stdout"
cat "$xchg/stderr" >&2
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
  echo "rdma-vm: the VM ran past ${timeout_s} s (the command started $([ -f "$xchg/started" ] && echo yes || echo no))" >&2
  [ -f "$xchg/started" ] || guest_said
  exit 124
fi
if [ -s "$xchg/setup-failed" ] || [ ! -f "$xchg/rc" ]; then
  echo "rdma-vm: the VM or its RDMA set-up failed; the guest said:" >&2
  guest_said
  exit 125
fi
exit "$(cat "$xchg/rc")"
