#!/usr/bin/env bash
# A lent GPU machine, one command: install jaxoff from this tree beside the machine's own CUDA
# JAX (no network: wheels from .whl/, made here by bench/gpu/wheels.sh), then run
# bench/gpu/pager_probe.py's parts, the pager's first, each under its own deadline, within
# SECONDS of the script's start, the install counted. At most six files land in OUT:
# session.log, summary.json (commit, machine, versions, each part's status, the figures
# against their goals), pager.json, plain_vs_jaxoff.json, facts.json and, when asked for,
# capacity.json.
#
#   bash bench/gpu_session.sh OUT [--seconds 530] [--pager new|legacy] [--smoke]
#   PARTS="pager plain_vs_jaxoff" bash bench/gpu_session.sh OUT      # some parts, in order
#   bash bench/gpu_session.sh OUT --pager legacy    # the old pager, from .legacy/ (LEGACY_TREE)
#   bash bench/gpu_session.sh OUT --smoke           # the whole control flow on a CPU, tiny sizes
#
# --pager legacy measures the pager part with a checkout of commit 8abcffe, the last with the
# old paging calls (`git worktree add .legacy 8abcffe`, carried with the call), built here in
# its place; without that checkout it stops at once, in one line. --smoke installs nothing:
# it runs the parts on JAX's CPU platform with the jaxoff importable here.
set -u
usage="usage: bash bench/gpu_session.sh OUT [--seconds N] [--pager new|legacy] [--smoke]"
OUT=${1:?$usage}; shift
SECONDS_ALL=530 PAGER=new SMOKE=
while (( $# )); do
  case $1 in
    --seconds) SECONDS_ALL=$2; shift 2 ;;
    --pager) PAGER=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
START=$(date +%s)
LEGACY_TREE=${LEGACY_TREE:-.legacy}
PARTS=${PARTS:-pager plain_vs_jaxoff gpu_pager xla_facts pcie handlers}
PROBE=(python3 bench/gpu/pager_probe.py --pager "$PAGER" --legacy-tree "$LEGACY_TREE")
# One line, before anything is installed or written, when the legacy tree is missing.
"${PROBE[@]}" --check --parts $PARTS || exit 2
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
left() { echo $(( START + SECONDS_ALL - $(date +%s) )); }

echo "== machine $(date +%T): $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
python3 --version
TREE=$PWD; [ "$PAGER" = legacy ] && TREE=$(cd "$LEGACY_TREE" && pwd)
SETUP='"smoke"'
if [ -n "$SMOKE" ]; then
  export JAX_PLATFORMS=cpu
else
  export JAX_PLATFORMS=cuda,cpu
  t0=$(date +%s)
  if [ -d .whl ]; then  # --target: nothing of the image's own is replaced
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  # jaxoff from TREE (this one, or the legacy checkout), built unless it already is (a warm
  # machine); imported from /tmp so that the working directory cannot stand in for it.
  where() { (cd /tmp && python3 -c "import jaxoff.aio, jaxoff; print(jaxoff.__file__)" 2>/dev/null); }
  build=skipped
  case $(where) in
    "$TREE"/*) ;;
    *) echo "== build $TREE $(date +%T)"
       CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) JAXOFF_CUDA=on timeout $(( $(left) - 60 )) \
         python3 -m pip install --no-build-isolation --no-deps -e "$TREE" >/tmp/jaxoff-build.log 2>&1
       build="exit $?"
       echo "== build: $build $(date +%T)"
       [ "$build" = "exit 0" ] || tail -30 /tmp/jaxoff-build.log ;;
  esac
  # jaxoff.aio loads the extension before jax (the order that once crashed)
  (cd /tmp && python3 -X faulthandler -c "import jaxoff.aio as a; print(a.cuda_status())")
  SETUP="{\"build\": \"$build\", \"tree\": \"$TREE\", \"setup_s\": $(( $(date +%s) - t0 )), \"jaxoff\": \"$(where)\"}"
fi
# The page stores: tmpfs (host memory), unless STORE names an NVMe folder.
STORE=${STORE:-/dev/shm/jaxoff-gpu}
[ -n "$SMOKE" ] && STORE=${STORE_SMOKE:-$(mktemp -d)}
l=$(left)
echo "== parts: $PARTS ($l s left) $(date +%T)"
timeout --signal=KILL $(( l - 3 )) "${PROBE[@]}" "$OUT" --deadline-s $(( l - 10 )) \
  --store-dir "$STORE" --setup "$SETUP" --parts $PARTS ${SMOKE:+--smoke}
rc=$?
[ -n "$SMOKE" ] && rmdir "$STORE" 2>/dev/null
echo "== done $(date +%T): exit $rc, $(left) s before the deadline"
exit $rc
