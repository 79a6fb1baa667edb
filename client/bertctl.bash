# bash completion for bertctl (installed as
# share/bash-completion/completions/bertctl). Job ids and dataset names are
# asked of the daemon with bertctl itself (its URL and token as configured).
_bertctl_ids() {
  bertctl list --all 2>/dev/null | awk 'NR > 1 { print $1 }'
}
_bertctl_datasets() {
  bertctl datasets list 2>/dev/null | awk 'NR > 1 { print $1 }'
}
_bertctl() {
  local cur prev cmd i
  COMPREPLY=()
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  local commands="submit list show follow cancel delete patch download datasets version help"
  local global="--json --url --cacert --config --verbose --help"
  cmd=""
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${COMP_WORDS[i]} in
      --url|--config|--cacert) ((i++)) ;;
      -*) ;;
      *) cmd=${COMP_WORDS[i]}; break ;;
    esac
  done
  case $prev in
    --config|--cacert|-o|--output) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --state) COMPREPLY=($(compgen -W "queued starting running restarting stopping completed failed canceled" -- "$cur")); return ;;
    --order) COMPREPLY=($(compgen -W "asc desc" -- "$cur")); return ;;
    --format) COMPREPLY=($(compgen -W "text jsonl" -- "$cur")); return ;;
    --dataset) COMPREPLY=($(compgen -W "$(_bertctl_datasets)" -- "$cur")); return ;;
    --preset) COMPREPLY=($(compgen -W "bert-tiny bert-mini bert-small bert-medium bert-base bert-large" -- "$cur")); return ;;
    --url|--name|--max-steps|--priority|--tag|--notes|--learning-rate|--batch-size|--max-seq-length|--gpus|--set|\
    --idempotency-key|--limit|--owner|--rank|--loader|--tail|--retry-s|--checkpoint|--vocab-size|--text-field|\
    --threads|--include|--exclude) return ;;
    --source|--vocab-file|--prepared) COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
  if [ -z "$cmd" ]; then
    COMPREPLY=($(compgen -W "$commands $global" -- "$cur"))
    return
  fi
  local opts=""
  case $cmd in
    submit) opts="--dataset --preset --max-steps --name --priority --tag --notes --learning-rate --batch-size
                  --max-seq-length --gpus --set --idempotency-key" ;;
    list) opts="--state --tag --owner --limit --all --order" ;;
    follow) opts="--no-logs --no-events --rank --loader --tail --retry-s" ;;
    delete) opts="--keep-files" ;;
    patch) opts="--priority --name --tag --no-tags --notes --no-notes" ;;
    download) opts="--checkpoint --hf -o --output" ;;
    datasets) opts="--name --source --vocab-file --vocab-size --format --text-field --lowercase --cased --threads
                    --include --exclude --prepared --set --wait" ;;
    help) COMPREPLY=($(compgen -W "$commands" -- "$cur")); return ;;
  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$opts $global" -- "$cur"))
    return
  fi
  case $cmd in
    show|follow|cancel|delete|patch|download)
      COMPREPLY=($(compgen -W "$(_bertctl_ids)" -- "$cur")) ;;
    submit) COMPREPLY=($(compgen -f -- "$cur")) ;;
    datasets)
      if [ "$prev" = datasets ]; then
        COMPREPLY=($(compgen -W "list show create delete" -- "$cur"))
      elif [ "$prev" = show ] || [ "$prev" = delete ]; then
        COMPREPLY=($(compgen -W "$(_bertctl_datasets)" -- "$cur"))
      else
        COMPREPLY=($(compgen -f -- "$cur"))
      fi ;;
  esac
}
complete -F _bertctl bertctl
