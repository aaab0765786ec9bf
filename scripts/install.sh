#!/usr/bin/env bash
# Install trainyard into .venv, one line per step saying what is installed and how long it took.
#   scripts/install.sh demo   # trainyard + the `train` extra (torch's CPU build): what `make demo` needs
#   scripts/install.sh test   # that, plus what the tests need: `dev`, `test-s3`, `test-web`
# torch is never a CUDA build: its local CPU wheel when pip's find-links has one (this kind of
# machine: /opt/wheels), else the CPU-only index download.pytorch.org/whl/cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?usage: scripts/install.sh demo|test}
PYTHON=${PYTHON:-python3}
VENV=.venv
PY=$VENV/bin/python
TORCH=torch==2.13.0
# --no-compile: no .pyc for the whole of torch now (~10 s here); Python writes those it imports.
PIP=("$PY" -m pip install --quiet --disable-pip-version-check --no-input --no-compile)

step() {  # step "what is installed" command...: the line, the command, the time it took
  local label=$1 start=$SECONDS
  shift
  echo "== $label"
  "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  echo "   done in $((SECONDS - start)) s"
}

torch_cpu() {
  if ! "${PIP[@]}" --no-index --no-deps "$TORCH" 2>/dev/null; then
    echo "   (no local wheel of $TORCH: taking the CPU build from download.pytorch.org/whl/cpu)"
    "${PIP[@]}" --no-deps --index-url https://download.pytorch.org/whl/cpu "$TORCH"
  fi
  local version
  version=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')
  case $version in
    *+cpu) ;;
    *) echo "error: torch $version in $VENV is not the CPU build; remove $VENV and run make again" >&2
       exit 1 ;;
  esac
}

if [ ! -x "$PY" ]; then
  step "[1/3] .venv: a virtual environment of $("$PYTHON" -V 2>&1) ($PYTHON)" "$PYTHON" -m venv "$VENV"
fi
case $what in
  demo)
    if [ ! -f "$VENV/.torch-installed" ]; then
      step "[2/3] torch 2.13.0, CPU build (about 200 MB; never a CUDA build)" torch_cpu
      touch "$VENV/.torch-installed"
    fi
    step "[3/3] trainyard (editable, with its commands trainyard and osmo) and what it needs: fastapi, uvicorn, sqlalchemy, pydantic, typer, rich, httpx, fsspec, jinja2; the train extra: numpy, scikit-learn" \
      "${PIP[@]}" -e '.[train]'
    ;;
  test)
    step "test tools: pytest, hypothesis, pytest-timeout (dev); s3fs, moto (test-s3); selenium, jupyterlab (test-web)" \
      "${PIP[@]}" -e '.[train,dev,test-s3,test-web]'
    ;;
  *) echo "usage: scripts/install.sh demo|test" >&2; exit 2 ;;
esac
