#!/usr/bin/env bash
# Install trainyard into .venv, one line per step saying what is installed and how long it took.
#   scripts/install.sh demo   # trainyard + the `train` extra (torch's CPU build): what `make demo` needs
#   scripts/install.sh test   # that, plus what the tests need: `dev`, `test-s3`, `test-web`
#   scripts/install.sh lock   # remake requirements/demo.lock from pyproject.toml
# torch is never a CUDA build: its local CPU wheel when pip's find-links has one (this kind of
# machine: /opt/wheels), else the CPU-only index download.pytorch.org/whl/cpu. The demo's
# other packages come pinned from requirements/demo.lock (no resolver run), installed while
# torch is; should that fail (a pin this machine's indexes lack), pip resolves them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?usage: scripts/install.sh demo|test|lock}
PYTHON=${PYTHON:-python3}
VENV=.venv
PY=$VENV/bin/python
TORCH=torch==2.13.0
LOCK=requirements/demo.lock
# pip installs without compiling (compiling all of torch is ~75 s of CPU here, most of it for
# modules nothing imports); installed_and_compiled() then writes the .pyc of what the server, the CLI and
# the demo's tasks import, by importing it. Those must exist before the first use: left to it,
# the first server start compiled fastapi, pydantic, sqlalchemy... past its 30 s start limit
# on a loaded machine, and sandboxed tasks, which cannot write into the venv, would compile
# torch at every import.
# pip itself runs with bytecode caching on, whatever the caller set: its own modules compile once.
PIP=(env -u PYTHONDONTWRITEBYTECODE "$PY" -m pip install --quiet --disable-pip-version-check --no-input --no-compile)

quiet() {  # run a command; drop pip's notes about the machine's missing extra index folders
  "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

step() {  # step "what is installed" command...: the line, the command, the time it took
  local label=$1 start=$SECONDS
  shift
  echo "== $label"
  quiet "$@"
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
       return 1 ;;
  esac
}

pinned() {  # the lock's packages without resolving; else resolve trainyard[train] (torch is in)
  if ! "${PIP[@]}" --no-deps -r "$LOCK"; then
    echo "   ($LOCK did not install here: resolving trainyard's dependencies instead)"
    "${PIP[@]}" -e '.[train]'
  fi
}

together() {  # torch and the pinned packages at once (two pip processes, distinct packages)
  torch_cpu & local torch=$!
  pinned & local rest=$!
  local failed=0
  wait "$torch" || failed=1
  wait "$rest" || failed=1
  return "$failed"
}

editable() {  # trainyard itself (its build needs the setuptools the lock brought)
  "${PIP[@]}" --no-deps --no-build-isolation -e .
}

checked() {  # every requirement met, else pip resolves trainyard[train] (torch is in already)
  "$PY" -m pip check --disable-pip-version-check >/dev/null || {
    echo "   (some dependency is missing or outdated: pip resolves trainyard[train])"
    "${PIP[@]}" -e '.[train]'
  }
}

venv() {  # a venv with a current pip, without ensurepip (which compiles all of its bundled pip:
  # ~9 s here). The bundled pip runs from its wheel (pip.pypa.io, "Installation") to install
  # pip >= 25.1, whose index scan takes half the CPU of 23.x over the lock's 49 packages; offline,
  # the bundled wheel itself. Should any of that fail: the standard venv.
  "$PYTHON" -m venv --without-pip "$VENV"
  local wheel
  wheel=$("$PY" -c 'import ensurepip, pathlib
print(next(pathlib.Path(ensurepip.__file__).parent.glob("_bundled/pip-*.whl")))' 2>/dev/null) && {
    env -u PYTHONDONTWRITEBYTECODE "$PY" "$wheel/pip" install --quiet --disable-pip-version-check \
      --no-input --no-compile --no-deps 'pip>=25.1' 2>/dev/null ||
      env -u PYTHONDONTWRITEBYTECODE "$PY" "$wheel/pip" install --quiet \
        --disable-pip-version-check --no-input --no-compile --no-index --no-deps "$wheel" 2>/dev/null
  } || "$PYTHON" -m venv --clear "$VENV"
}

# What the demo's tasks import, by module (a name that no longer imports is passed over):
# torch's optimizers import torch._dynamo (sympy and ~1,000 modules) at their first use; with
# no .pyc, each of the demo's four training processes compiled them (~8 s of CPU apiece,
# half the demo's time on 2 cores), since a sandboxed task cannot write into the venv.
WARM_TORCH="torch torch._dynamo torch.distributed.run torch.nn.parallel"
# What the server and the CLI import.
WARM_SERVE="uvicorn fastapi sqlalchemy pydantic typer rich httpx jinja2"
WARM_OURS="trainyard.cli.main trainyard.cli.workflow trainyard.cli.dataset trainyard.server.app
trainyard.server.service trainyard.server.web trainyard.engine.reconciler trainyard.backends.local
trainyard.runner.main"

warm() {  # write the .pyc of the named modules and what they import, by importing them
  env -u PYTHONDONTWRITEBYTECODE "$PY" -c 'import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:
        pass' "$@"
}

ours() {  # trainyard itself, checked, and the .pyc of its src/ (all cores) and of the server
  editable
  checked
  "$PY" -m compileall -q -j 0 src >/dev/null || true
  warm $WARM_SERVE $WARM_OURS
}

installed_and_compiled() {  # ours() on one core while torch's modules compile on the other
  warm $WARM_TORCH & local torch=$!
  ours
  wait "$torch" || true
  warm trainyard.training.train
}

if [ "$what" = lock ]; then
  report=$(mktemp)
  quiet "$PYTHON" -m pip install --quiet --dry-run --ignore-installed --report "$report" -e '.[train]'
  { sed -n '/^#/p' "$LOCK"
    "$PYTHON" -c 'import json, sys
rows = json.load(open(sys.argv[1]))["install"]
for r in sorted(rows, key=lambda r: r["metadata"]["name"].lower()):
    if r["metadata"]["name"] not in ("trainyard", "torch"):
        print(r["metadata"]["name"] + "==" + r["metadata"]["version"])' "$report"
  } > "$LOCK.new"
  mv "$LOCK.new" "$LOCK"
  rm -f "$report"
  echo "wrote $LOCK"
  exit 0
fi
if [ ! -x "$PY" ]; then
  step "[1/3] .venv: a virtual environment of $("$PYTHON" -V 2>&1) ($PYTHON)" venv
fi
case $what in
  demo)
    step "[2/3] torch 2.13.0, CPU build (~200 MB, never a CUDA build), and at once what trainyard needs ($LOCK: fastapi, uvicorn, sqlalchemy, pydantic, typer, rich, httpx, fsspec, jinja2; numpy, scikit-learn)" \
      together
    step "[3/3] trainyard itself (editable: src/ is what runs; commands trainyard and osmo), and the .pyc of what the server, the CLI and the demo's tasks import, so that they start fast" \
      installed_and_compiled
    ;;
  test)
    step "test tools: pytest, hypothesis, pytest-timeout (dev); s3fs, moto (test-s3); selenium, jupyterlab (test-web)" \
      "${PIP[@]/--no-compile/--compile}" -e '.[train,dev,test-s3,test-web]'
    ;;
  *) echo "usage: scripts/install.sh demo|test|lock" >&2; exit 2 ;;
esac
