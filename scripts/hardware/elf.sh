# Helpers over a bundle's ELF files and what ldd says they need. Sourced.

# The libraries every machine that runs the bundle has: glibc's, the C++
# runtime, and the two that must be the machine's own (the CUDA driver,
# which matches its kernel module, and NCCL, which torch on that machine
# also loads).
elf_system_lib() {
  case $1 in
    linux-vdso.so.1 | ld-linux-x86-64.so.2 | /lib64/ld-linux-x86-64.so.2 | libc.so.6 | libm.so.6 | libdl.so.2 | \
      libpthread.so.0 | librt.so.1 | libutil.so.1 | libresolv.so.2 | libstdc++.so.6 | libgcc_s.so.1) return 0 ;;
    *) return 1 ;;
  esac
}
elf_machine_lib() {
  case $1 in
    libcuda.so.1 | libnccl.so.2) return 0 ;;
    *) return 1 ;;
  esac
}

# Every ELF file under DIR/bin and DIR/lib (not links).
elf_files() {
  local f
  for f in "$1"/bin/* "$1"/lib/*; do
    [ -f "$f" ] && [ ! -L "$f" ] && head -c4 "$f" | grep -q 'ELF' && echo "$f"
  done
  return 0
}

# Reads ldd's output; prints "NAME PATH" for each library found outside
# DIR that a bare machine would lack (neither the system's nor the machine's own).
elf_foreign_deps() {
  local dir name path
  dir=$(cd "$1" && pwd -P)
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
    elf_system_lib "$name" && continue
    elf_machine_lib "$name" && continue
    case $(readlink -f "$path") in "$dir"/*) continue ;; esac
    echo "$name $path"
  done
}
