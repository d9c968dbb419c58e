#!/bin/bash
# Fails (and lists the files) when a tracked C++ file differs from what
# clang-format-14 makes of it under .clang-format. To fix: scripts/check_format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
FORMAT=${CLANG_FORMAT:-clang-format-14}
command -v "$FORMAT" >/dev/null || { echo "check_format: $FORMAT not found (scripts/install-deps.sh installs it)" >&2; exit 2; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # Tracked files and new ones not ignored yet, so that --fix formats a file before its first commit.
  mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h')
else  # an exported tree without git
  mapfile -t files < <(find base model train tools server client bench tests -name '*.cc' -o -name '*.h')
fi
if [[ "${1:-}" == "--fix" ]]; then
  "$FORMAT" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! "$FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} file(s) not formatted as .clang-format says (run scripts/check_format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
