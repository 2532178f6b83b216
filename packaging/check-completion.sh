#!/bin/bash
# The bash completion against what bcd says it takes: every command of `bcd --help` is offered,
# every option of each command's usage line is offered after it, and the fixed values of --role.
#   check-completion.sh COMPLETION BCD
set -eu
completion=$1
bcd=$2
# shellcheck source=/dev/null
source "$completion"
fail() {
  echo "check-completion: $*" >&2
  exit 1
}
# The words offered for the command line "$@" with the cursor on a new last word.
offered() {
  COMP_WORDS=(bcd "$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  _bcd
  printf '%s\n' "${COMPREPLY[@]}" | sort
}
commands=$("$bcd" --help | sed -n '/^Commands:/,/^$/p' | awk 'NR > 1 && NF {print $1}')
[ -n "$commands" ] || fail "bcd --help lists no commands"
for command in $commands; do
  offered "" | grep -qx "$command" || fail "\"$command\" is not offered as a command"
  # Every --option in the command's usage (its help but the last line, the summary).
  for option in $("$bcd" "$command" --help | sed '$d' | grep -o -- '--[a-z0-9-]*' | sort -u); do
    offered "$command" "" | grep -qx -- "$option" || fail "bcd $command: $option is not offered"
  done
done
[ "$(offered st)" = status ] || fail "\"st\" does not complete to status"
[ "$(offered join --role "" | tr '\n' ' ')" = "node site " ] || fail "--role offers other values"
[ "$(offered status --j)" = --json ] || fail "bcd status --j does not complete to --json"
[ -z "$(offered join --token "")" ] || fail "a value only the user knows was completed"
echo "completion ok: $(wc -w <<<"$commands") commands"
