# bash completion for bcd: its commands, each command's options, and files or fixed values where an
# option takes one. Installed as /usr/share/bash-completion/completions/bcd; needs bash alone (no
# helper from the bash-completion package), so it also works sourced by hand.

_bcd() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  local prev=""
  [ "$COMP_CWORD" -gt 0 ] && prev=${COMP_WORDS[COMP_CWORD - 1]}
  local commands="join node site ramdisk status inventory install-script version upgrade-recover help"
  COMPREPLY=()
  if [ "$COMP_CWORD" -eq 1 ]; then
    mapfile -t COMPREPLY < <(compgen -W "$commands --help --version" -- "$cur")
    return 0
  fi
  case $prev in
    --config | --token-file | --credential-file | --proxy-ca-file | --release-key)
      mapfile -t COMPREPLY < <(compgen -f -- "$cur")
      return 0
      ;;
    --role)
      mapfile -t COMPREPLY < <(compgen -W "node site" -- "$cur")
      return 0
      ;;
    --attestor)
      mapfile -t COMPREPLY < <(compgen -W "join-token provisioned" -- "$cur")
      return 0
      ;;
    --token | --node-id | --gateway-url | --ca-pin | --websocket-url | --binary-url | \
      --binary-sha256 | --gateway-server-name)
      return 0 # a value only the user knows
      ;;
  esac
  local options="--config --help"
  case ${COMP_WORDS[1]} in
    join) options+=" --token --token-file --role --node-id --attestor --credential-file" ;;
    status | version) options+=" --json" ;;
    install-script)
      options+=" --gateway-url --ca-pin --token --role --websocket-url --proxy-ca-file"
      options+=" --release-key --binary-url --binary-sha256 --gateway-server-name"
      ;;
    node | site | ramdisk | inventory | upgrade-recover) ;;
    *) options="" ;;
  esac
  mapfile -t COMPREPLY < <(compgen -W "$options" -- "$cur")
  return 0
}

complete -o default -F _bcd bcd
