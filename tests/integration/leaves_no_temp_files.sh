#!/bin/sh
# Runs a test binary (with its arguments, one test) with TMPDIR set to an empty directory,
# and fails if the run leaves anything there: ctest starts a process per test,
# so a file left by each is hundreds of files on a developer's machine.
set -u
dir=$(mktemp -d) || exit 1
out=$(TMPDIR=$dir "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
left=$(ls -A "$dir")
rm -rf "$dir"
if [ "$rc" -ne 0 ]; then
  echo "leaves_no_temp_files: the test failed (exit $rc)" >&2
  exit "$rc"
fi
# A filter that matches nothing passes having written nothing.
case $out in
  *"[  PASSED  ] 1 test"*) ;;
  *) echo "leaves_no_temp_files: the run passed no test (a stale --gtest_filter?)" >&2; exit 1 ;;
esac
if [ -n "$left" ]; then
  echo "leaves_no_temp_files: left in TMPDIR: $left" >&2
  exit 1
fi
echo "leaves_no_temp_files: TMPDIR left empty"
