#!/usr/bin/env bash
# The flake census: the README's test command, `make test`, run K times in a row, each
# from a fresh clone of the committed HEAD (as CI runs it), some of them beside a busy
# neighbour (one process spinning on a core, as another job on a shared machine would).
#
#   scripts/flake_census.sh [RUNS] [BUSY]    RUNS: how many (default 5);
#                                            BUSY: how many of them with the neighbour,
#                                            the last ones (default 2)
#
# Prints one line per run (neighbour, pytest's closing line, wall seconds, the seconds of
# tests pytest reports) and then the failures by test id, and exits 1 when any run failed.
# Each run's whole output is kept under $CENSUS_DIR (default /tmp/flake-census) as run-N.log,
# its JUnit report as run-N.xml (scripts/test_durations.py reads one).
# The clone installs into its own .venv like a fresh machine; the llama.cpp wheel comes
# from the keyed cache scripts/install.sh fills, so only the first run ever compiles it.
set -uo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-5}
BUSY=${2:-2}
DIR=${CENSUS_DIR:-/tmp/flake-census}
SOURCE=$(pwd)
HEAD=$(git rev-parse --short HEAD)
mkdir -p "$DIR"
summary="$DIR/summary.txt"
: > "$summary"
[ -n "$(git status --porcelain --untracked-files=no)" ] && \
    echo "note: uncommitted changes are not in the census (it clones HEAD $HEAD)" >&2

spin_pid=""
stop_spin() { [ -n "$spin_pid" ] && kill "$spin_pid" 2>/dev/null; spin_pid=""; }
trap 'stop_spin' EXIT
trap 'stop_spin; exit 130' INT TERM

failed=0
for i in $(seq 1 "$RUNS"); do
    clone="$DIR/clone-$i"
    rm -rf "$clone"
    git clone --quiet --no-local "$SOURCE" "$clone" || exit 1
    neighbour="quiet"
    if [ "$i" -gt $((RUNS - BUSY)) ]; then
        neighbour="busy"
        # one core kept busy for the whole run: a shell loop never sleeps
        sh -c 'while :; do :; done' &
        spin_pid=$!
    fi
    start=$(date +%s)
    (cd "$clone" && CI=true make test \
        PYTEST_ARGS="-q -p no:cacheprovider --junitxml=$DIR/run-$i.xml" \
        </dev/null >"$DIR/run-$i.log" 2>&1)
    rc=$?
    took=$(( $(date +%s) - start ))
    stop_spin
    # pytest's closing line: "N passed, ... in S s" (-q), or the same between "=" rules
    closing=$(grep -E '(passed|failed|error).* in [0-9.]+s' "$DIR/run-$i.log" | tail -1 \
        | sed -E 's/^=+ //; s/ =+$//')
    [ -n "$closing" ] || closing="(no closing line: exit $rc)"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
    printf 'run %d  %-5s  exit %d  %4d s  %s\n' "$i" "$neighbour" "$rc" "$took" "$closing" \
        | tee -a "$summary"
    grep -E '^(FAILED|ERROR) ' "$DIR/run-$i.log" | sed "s/^/    run $i: /" | tee -a "$summary"
    rm -rf "$clone/.venv"  # 1 GB each; the logs stay
done
echo "census of $HEAD: $RUNS runs ($BUSY beside a busy neighbour), $failed failed" \
    | tee -a "$summary"
[ "$failed" -eq 0 ]
