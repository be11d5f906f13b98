#!/usr/bin/env bash
# scripts/hardware.sh: the checks that need a GPU or cores of their own,
# made here and run on a lent machine that has nothing of ours (docs/hardware.md).
#   pack [--build DIR] [--out DIR]     here: build what the stages run and write
#                                      the bundle (default build-hw/ -> hw-bundle/)
#   run [--bundle DIR] [--out DIR] [--budget S] [STAGE...]
#                                      there: every stage (or those named) from the
#                                      bundle; OUT/report.md and OUT/logs.tar.gz
#   check [DIR]                        the bundle loads nothing from outside
#                                      itself but glibc, libstdc++, CUDA's driver, NCCL
#   chroot [--bundle DIR] [--root DIR] [--out DIR]
#                                      here: `run` inside a bare Debian
#                                      (debootstrap --variant=minbase), no GPU
#   stages                             the stages, what each runs and needs
set -euo pipefail
here=$(dirname "$0")
command=${1:-}
[ $# -eq 0 ] || shift
case $command in
  pack) exec "$here/hardware/pack.sh" "$@" ;;
  run) exec "$here/hardware/run.sh" "$@" ;;
  check) exec env -u LD_LIBRARY_PATH "$here/hardware/closure.sh" "${1:-hw-bundle}" ;;
  chroot) exec "$here/hardware/chroot.sh" "$@" ;;
  stages)
    source "$here/hardware/stages.sh"
    for s in "${hw_stage_order[@]}"; do
      printf '%-13s %s\n%-13s runs %s; needs %s; at most %s s\n' "$s" "${hw_stage_title[$s]}" "" \
        "${hw_stage_files[$s]}" "${hw_stage_needs[$s]}" "${hw_stage_limit[$s]}"
    done
    ;;
  *)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
