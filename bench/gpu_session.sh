#!/usr/bin/env bash
# One lent GPU machine, one command: install jaxoff from source beside the machine's own CUDA
# JAX (no network), then run bench/gpu.py's parts in order of priority, each inside what is
# left of a deadline, copying every JSON record to OUT as soon as its part ends.
#
#   bash bench/gpu_session.sh OUT [SECONDS]     # SECONDS: the deadline (default 560)
#   PARTS="tests capacity-jaxoff" bash bench/gpu_session.sh OUT 300     # some parts, in order
#   PARTS=pager bash bench/gpu_session.sh OUT 420     # the GPU pager's probe (bench/gpu/)
#
# Wheels of pure dependencies the machine lacks (tyro, crc32c, ...) are read from .whl/ when
# it exists. Records are kept in /tmp/jaxoff-gpu between commands on the same machine, and a
# part that ran out of time resumes from them when the command is run again.
set -u
OUT=${1:?usage: bash bench/gpu_session.sh OUT [SECONDS]}
DEADLINE=$(( $(date +%s) + ${2:-560} ))
REC=/tmp/jaxoff-gpu
mkdir -p "$OUT" "$REC"
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
left() { echo $(( DEADLINE - $(date +%s) )); }
save() { cp -f "$REC"/*.json "$OUT"/ 2>/dev/null; true; }
# part NAME BUDGET ARGS...: bench/gpu.py with --budget-s BUDGET, killed at the deadline.
part() {
  local name=$1 budget=$2; shift 2
  local l; l=$(left)
  if (( l < 30 )); then echo "== $name: skipped, ${l} s left"; return; fi
  (( budget > l - 20 )) && budget=$(( l - 20 ))
  echo "== $name (budget ${budget} s, ${l} s left) $(date +%T)"
  timeout --signal=KILL $(( l - 5 )) python3 bench/gpu.py --out "$REC" --budget-s "$budget" \
    "${SEED_ARGS[@]}" "$@"
  echo "== $name: exit $? $(date +%T)"
  save
}

echo "== machine $(date +%T)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nproc; free -g | head -2; df -h /tmp | tail -1; python3 --version
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
if ! python3 -c "import jaxoff.aio" 2>/dev/null; then  # loads the built extension
  echo "== build $(date +%T)"
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 300 python3 -m pip install --no-build-isolation \
    --no-deps -e . >"$OUT/build.log" 2>&1
  echo "== build: exit $? $(date +%T)"
  grep -E "jaxoff:|Error|error:" "$OUT/build.log" | head -20
fi
# jaxoff.aio loads the extension before jax (the order that once crashed: results/gpu/diagnosis.txt)
python3 -X faulthandler -c "import jaxoff; from jaxoff.aio import cuda_status, backend_status; print(cuda_status()); print(backend_status())"

# Records of an earlier session on the same kind of GPU (SEED, default bench/results/gpu for
# an H200, bench/results/gpu-h100 for an H100): their verdicts are kept.
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case $GPU_NAME in
  *H100*) SEED_DEFAULT=bench/results/gpu-h100 ;;
  *H200*) SEED_DEFAULT=bench/results/gpu ;;
  *) SEED_DEFAULT=/nonexistent ;;
esac
SEED_ARGS=()
[ -d "${SEED-$SEED_DEFAULT}" ] && SEED_ARGS=(--seed "${SEED-$SEED_DEFAULT}")
# The fraction of this GPU's memory that is 3.4 GB (the Fuyou pair's cap on any GPU).
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
FRAC_3G4=$(python3 -c "print(round(3.4e9 / ($GPU_MIB * 2**20), 4))")
# Page stores of the paged probes (default: tmpfs, host memory; set STORE to an NVMe folder).
STORE=${STORE:-/dev/shm/jaxoff-gpu}
SIZE=(--layers 8 --d-model 2048 --seq-len 1024 --batch-size 8 --steps 5)
CAP=(--capacity-d-model 2048 --seq-len 1024 --batch-size 8 --mem-fraction 0.1)
# The CPU record's pair of modes, bf16 parameters with fp32 masters and moments: plain on the
# device against Fuyou with optimizer state and block parameters in the page store. 3.4 GB of
# device memory keeps a probe's page traffic to seconds a step (an H100 measured 1.5 s a step
# for Fuyou at 16 layers x 1024, which fit, where plain-bf16 did not).
FUYOU=(--capacity-name capacity_fuyou_3g4 --capacity-d-model 1024 --seq-len 1024 --batch-size 8
       --mem-fraction "$FRAC_3G4" --store-dir "$STORE")
run_part() {
  case $1 in
    env) part env 60 --parts env ;;
    tests) part tests 200 --parts tests ;;
    placements) part placements 120 --parts placements "${SIZE[@]}" \
      --placements device host_opt host_params host_params_stream1 paged:device ;;
    capacity-plain) part capacity-plain 90 --parts capacity --capacity-mode plain "${CAP[@]}" \
      --capacity-start-layers 12 --capacity-grow 1.5 ;;
    capacity-jaxoff) part capacity-jaxoff 150 --parts capacity --capacity-mode jaxoff \
      "${CAP[@]}" --capacity-start-layers 48 --capacity-grow 1.5 \
      --jaxoff-plans host_params_stream1 ;;
    capacity-bf16) part capacity-bf16 120 --parts capacity --capacity-mode plain "${FUYOU[@]}" \
      --plain-plans bench:plain-bf16 --capacity-start-layers 8 --capacity-grow 1.5 ;;
    capacity-fuyou) part capacity-fuyou 240 --parts capacity --capacity-mode jaxoff "${FUYOU[@]}" \
      --jaxoff-plans bench:fuyou-nvme --capacity-start-layers 32 --capacity-grow 1.5 ;;
    policies) part policies 90 --parts policies "${SIZE[@]}" ;;
    placements-rest) part placements-rest 120 --parts placements "${SIZE[@]}" \
      --placements host_opt_xfer host_params_stream2 paged:host_params ;;
    # The GPU pager's prepared run (bench/gpu/pager_probe.py): its own deadline, JSON into
    # OUT/pager_probe as each section ends.
    pager) local l; l=$(left)
      if (( l < 60 )); then echo "== pager: skipped, ${l} s left"; return; fi
      echo "== pager ($(( l - 20 )) s) $(date +%T)"
      timeout --signal=KILL $(( l - 5 )) python3 bench/gpu/pager_probe.py "$OUT/pager_probe" \
        --deadline-s $(( l - 20 )) --store-dir "$STORE"
      echo "== pager: exit $? $(date +%T)" ;;
    *) echo "unknown part $1" ;;
  esac
}
# capacity-jaxoff (host_params_stream1) is left to PARTS: XLA 0.11.2 does not compile its
# host-side update on a GPU (docs/gpu.md).
DEFAULT="env tests capacity-bf16 capacity-fuyou placements policies placements-rest"
DEFAULT="$DEFAULT capacity-plain"
for p in ${PARTS:-$DEFAULT}; do
  run_part "$p"
done
echo "== done $(date +%T), $(left) s before the deadline"
