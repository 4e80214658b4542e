#!/usr/bin/env bash
# What bench/gpu_session.sh needs on a lent GPU machine that has no network, made here (any
# x86-64 machine with pip and a network) in .whl/, which the device call carries:
#
#   bash bench/gpu/wheels.sh            # then: run(carry=[".whl"], ...) as docs/guide/gpu.md says
#
# - wheels of what that image lacks or holds at another version: jaxoff's pure-Python
#   dependencies (tyro, docstring-parser, typeguard, typing-extensions, crc32c, tensorboardX)
#   and the build backend pyproject.toml's [build-system] names (scikit-build-core,
#   nanobind), pinned to what this machine builds jaxoff with; CUDA JAX, flax, optax, CMake and ninja are the
#   image's own (bench/gpu_session.sh installs jaxoff with --no-deps --no-build-isolation);
# - .whl/source.json: the commit, and the blob id of every tracked file at that commit, so
#   that a copy of the tree without .git can say which commit it is and whether it was edited.
#
# Python 3.12 wheels for manylinux x86-64, one version of each. .whl/ is kept out of git
# (.git/info/exclude); its size is checked against the device call's 64 MiB.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qxF /.whl/ .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
rm -rf .whl && mkdir .whl
pin() { python3 -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo; }
want=()
for dist in tyro docstring-parser typeguard typing-extensions crc32c tensorboardX \
  scikit-build-core nanobind; do
  v=$(pin "$dist")
  want+=("$dist${v:+==$v}")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${want[@]}"
python3 - <<'PY'
import json, subprocess, time
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, check=True).stdout
blobs = {}
for line in git("ls-tree", "-r", "HEAD").splitlines():
    meta, path = line.split("\t", 1)
    mode, kind, sha = meta.split()
    if kind == "blob" and mode != "120000":
        blobs[path] = sha
doc = {
    "commit": git("rev-parse", "HEAD").strip(),
    "tree_clean_here": git("status", "--porcelain", "--untracked-files=no") == "",
    "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "blobs": blobs,
}
open(".whl/source.json", "w").write(json.dumps(doc) + "\n")
PY
ls -1 .whl
total=$(du -sk .whl | cut -f1)
echo "$(( total / 1024 )) MiB in .whl (the device call carries at most 64 MiB with the tree)"
(( total < 32 * 1024 )) || { echo "wheels.sh: .whl is ${total} KiB, over the 32 MiB kept for it" >&2; exit 1; }
