#!/bin/sh
# cpu_family.sh FAMILY COMMAND...: runs COMMAND with TXL_CPU_ISA=FAMILY, so the CPU kernels use
# that family's paths only (model/kernels/cpu_isa.h), or exits 77 (CTest: skipped) naming the
# family when this CPU does not have it.
family=$1
shift
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() {
  for f in "$@"; do
    case " $flags " in
      *" $f "*) ;;
      *) return 1 ;;
    esac
  done
}
case $family in
  plain) ok=yes ;;
  avx2) has avx2 fma && ok=yes ;;
  avx512) has avx512f avx512bw && ok=yes ;;
  avx512_bf16) has avx512f avx512bw avx512_bf16 && ok=yes ;;
  amx) has avx512f avx512bw amx_bf16 amx_tile && ok=yes ;;
  *)
    echo "cpu_family.sh: unknown family $family (plain, avx2, avx512, avx512_bf16, amx)" >&2
    exit 2
    ;;
esac
if [ -z "$ok" ]; then
  echo "skipped: this CPU has no $family"
  exit 77
fi
TXL_CPU_ISA=$family exec "$@"
