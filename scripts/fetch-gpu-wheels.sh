#!/usr/bin/env bash
# Fetch, on a machine with a package index, the wheels that a GPU host without one lacks for tuning:
# Optuna, matplotlib and the packages they need that an image with torch, jinja2 and pytest usually lacks
# (CPython 3.12, manylinux x86_64).
#   scripts/fetch-gpu-wheels.sh [DIR]          (DIR defaults to .whl, which git ignores)
# Then, on the GPU host:
#   pip install --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# (scripts/gpu-session.sh does that itself when it finds .whl/). PYTHON_VERSION=3.11 fetches for
# another interpreter; EXTRA_WHEELS="name ..." adds packages.
set -euo pipefail
dir=${1:-.whl}
py=${PYTHON_VERSION:-3.12}
mkdir -p "$dir"
# matplotlib and what it needs beyond numpy draw the tune's reports (without them a tune still runs and
# says in one line that it wrote no report)
for pkg in optuna alembic sqlalchemy colorlog mako \
    matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six ${EXTRA_WHEELS:-}; do
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$dir" \
    --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    "$pkg"
done
ls -1 "$dir"
