#!/usr/bin/env bash
# Mutation checks: for each mutant of tests/mutation/mutants.tsv (one line of a security or
# durability check changed), apply it, rebuild, run the tests that must notice, and put the line
# back. A mutant is killed when those tests fail; one that survives is a check no test watches.
#
#   tests/mutation/run.sh [--quick] [--build DIR] [ID...]
#
# --quick runs the mutants marked quick (what CI runs); IDs run those mutants only; DIR is a
# configured build tree (default build/). Prints killed/survived per mutant and a summary; exits
# 1 when one survived or could not be tried (its line missing, it did not build, no test matched).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build
quick=0
only=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --build) build=$2; shift ;;
    -*) echo "usage: $0 [--quick] [--build DIR] [ID...]" >&2; exit 2 ;;
    *) only+=("$1") ;;
  esac
  shift
done
# A run killed outright (SIGKILL, a reboot) cannot put its line back: refuse to start while a file
# that mutants change differs from git, rather than test a mutant on top of another.
changed=$(awk -F'\t' '$1 !~ /^(#|$)/ { print $3 }' "$root/tests/mutation/mutants.tsv" | sort -u |
  (cd "$root" && xargs git diff --name-only --))
if [ -n "$changed" ]; then
  echo "$0: these files differ from git (a mutant left by an interrupted run?): $changed" >&2
  echo "commit or restore them first (git checkout -- FILE)" >&2
  exit 2
fi
tmp=$(mktemp -d)
current=""
restore() {
  if [ -n "$current" ]; then cp "$tmp/original" "$root/$current"; current=""; fi
}
trap 'restore; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

killed=0 survived=0 untried=0
while IFS=$'\t' read -r id mark file from to tests; do
  case $id in ''|'#'*) continue ;; esac
  if [ "$quick" = 1 ] && [ "$mark" != quick ]; then continue; fi
  if [ ${#only[@]} -gt 0 ] && ! printf '%s\n' "${only[@]}" | grep -qx -- "$id"; then continue; fi
  path=$root/$file
  if [ "$(grep -cF -- "$from" "$path")" != 1 ]; then
    printf '%-36s UNTRIED: the line is not in %s exactly once\n' "$id" "$file"
    untried=$((untried + 1))
    continue
  fi
  if ctest --test-dir "$build" -N -R "$tests" | grep -q 'Total Tests: 0'; then
    printf '%-36s UNTRIED: no test matches %s\n' "$id" "$tests"
    untried=$((untried + 1))
    continue
  fi
  cp "$path" "$tmp/original"
  current=$file
  FROM=$from TO=$to perl -0pi -e 's/\Q$ENV{FROM}\E/$ENV{TO}/' "$path"
  if ! cmake --build "$build" >"$tmp/build.log" 2>&1; then
    printf '%-36s UNTRIED: it did not build (%s)\n' "$id" "$(grep -m1 'error' "$tmp/build.log")"
    untried=$((untried + 1))
  elif ctest --test-dir "$build" -R "$tests" -j 2 --timeout 300 >"$tmp/test.log" 2>&1; then
    printf '%-36s SURVIVED: %s passed with %s:%s changed\n' "$id" "$tests" "$file" "$from"
    survived=$((survived + 1))
  else
    failed=$(grep -c '(Failed)\|(Subprocess\|(Timeout)\|Exception' "$tmp/test.log")
    printf '%-36s killed (%s failing tests of %s)\n' "$id" "$failed" "$tests"
    killed=$((killed + 1))
  fi
  restore
done <"$root/tests/mutation/mutants.tsv"

# The build tree gets the real sources back.
cmake --build "$build" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
for id in "${only[@]}"; do
  if ! cut -f1 "$root/tests/mutation/mutants.tsv" | grep -qx -- "$id"; then
    echo "$id: no such mutant in tests/mutation/mutants.tsv"
    untried=$((untried + 1))
  fi
done
echo "mutants: $killed killed, $survived survived, $untried untried"
[ "$survived" = 0 ] && [ "$untried" = 0 ]
