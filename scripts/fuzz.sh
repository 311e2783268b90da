# shellcheck shell=bash
# ./run.sh fuzz [seconds] [pattern]: run every fuzz target of the product
# (B1: every parser of peer input has one) for `seconds` each
# (default 10), or only the targets whose "package.FuzzName" matches the
# extended regular expression `pattern`.
# Sourced by run.sh (which sets ROOT and log). Not part of CI: `./run.sh test`
# runs every target's seed corpus as a plain test already.
#
# Knobs (environment):
#   IOP_FUZZ_JOBS     targets run at once (default 1); each gets
#                     max(1, nproc / jobs) fuzzing workers (-parallel)
#   IOP_FUZZ_NICE     nice level of the runs (default 0; 19 on a shared machine)
#   IOP_FUZZ_MINIMIZE -fuzzminimizetime (default 10s: a new input is
#                     minimized for at most that long)
# A failing input is written by `go test` to the package's
# testdata/fuzz/<FuzzName>/ directory: once the bug is fixed, commit it as a
# seed. Logs: .run/fuzz/<package>.<FuzzName>.log; the summary lists each
# target's result and the new files under testdata/fuzz.

fuzz_targets() { # prints "importpath FuzzName" lines, from the product module's _test.go files
  local f dir
  grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' "$ROOT/internal" "$ROOT/edge" "$ROOT/node" 2>/dev/null |
    sort | while IFS= read -r f; do
      dir=$(dirname "${f#"$ROOT"/}")
      case "$dir" in internal/e2e/sdk*|internal/bench*) continue ;; esac # their own modules
      grep -oE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' "$f" | sed -E 's/^func (Fuzz[A-Za-z0-9_]*).*/\1/' |
        while IFS= read -r name; do echo "iop/$dir $name"; done
    done
}

fuzz_one() { # $1 package, $2 target, $3 seconds, $4 workers; returns go test's status
  local pkg=$1 name=$2 secs=$3 workers=$4
  local logf="$ROOT/.run/fuzz/${pkg//\//_}.$name.log"
  local start rc=0
  start=$(date +%s)
  nice -n "${IOP_FUZZ_NICE:-0}" go test -run '^$' -fuzz "^${name}\$" -fuzztime "${secs}s" \
    -timeout "$((secs + 600))s" -fuzzminimizetime "${IOP_FUZZ_MINIMIZE:-10s}" -parallel "$workers" "$pkg" >"$logf" 2>&1 || rc=$?
  local execs
  execs=$(grep -ao 'execs: [0-9]*' "$logf" | tail -1 | cut -d' ' -f2 || true)
  if [ $rc = 0 ]; then
    log "ok   $pkg $name ($(( $(date +%s) - start ))s, ${execs:-?} execs)"
  else
    log "FAIL $pkg $name: see $logf"
    grep -E 'Failing input written|fuzz_test.go|panic:' "$logf" | head -5 >&2 || true
  fi
  return $rc
}

fuzz_main() {
  local secs=${1:-10} pattern=${2:-.}
  case "$secs" in ''|*[!0-9]*) echo "usage: ./run.sh fuzz [seconds] [pattern]" >&2; return 2 ;; esac
  mkdir -p "$ROOT/.run/fuzz"
  local jobs=${IOP_FUZZ_JOBS:-1} cores
  cores=$(nproc 2>/dev/null || echo 2)
  local workers=$(( cores / jobs )); [ "$workers" -ge 1 ] || workers=1
  local targets=() line
  while IFS= read -r line; do
    local pkg=${line% *} name=${line#* }
    if echo "${pkg#iop/}.$name" | grep -Eq -- "$pattern"; then targets+=("$line"); fi
  done < <(fuzz_targets)
  if [ ${#targets[@]} = 0 ]; then log "no fuzz target matches $pattern"; return 1; fi
  log "${#targets[@]} fuzz targets, ${secs}s each, $jobs at a time, $workers workers each"
  local failed=0 running=0 pids=() t
  for t in "${targets[@]}"; do
    fuzz_one "${t% *}" "${t#* }" "$secs" "$workers" &
    pids+=($!)
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
      wait -n "${pids[@]}" || failed=$((failed + 1)) # whichever ends first frees its slot
      local alive=() p
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
      pids=("${alive[@]}")
      running=${#pids[@]}
    fi
  done
  while [ ${#pids[@]} -gt 0 ]; do
    wait -n "${pids[@]}" || failed=$((failed + 1))
    local alive=() p
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
    pids=("${alive[@]}")
  done
  local new
  new=$(git -C "$ROOT" status --porcelain --untracked-files=all -- '*testdata/fuzz/*' | cut -c4- || true)
  if [ -n "$new" ]; then log "new inputs under testdata/fuzz (fix, then commit as seeds):"; echo "$new" >&2; fi
  if [ $failed != 0 ]; then log "$failed of ${#targets[@]} fuzz targets failed"; return 1; fi
  log "all ${#targets[@]} fuzz targets ran ${secs}s clean"
}
