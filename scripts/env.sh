# Sourced by scripts/demo and scripts/test: create or reuse .venv and install vidsight into it,
# every package at the version constraints.txt names (the versions the suite passed with).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Reinstall only when the dependency list or the lock changed since the last install.
if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ] || [ constraints.txt -nt .venv/.installed ]; then
  pip_install() { .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt "$@"; }
  pip_install -e ".[test]"
  # lmms-eval's own requirements pin PyAV below 16 and torchvision for other models' decoders;
  # the `eval` extra holds what its evaluator needs with vidsight's model (README, "lmms-eval").
  pip_install --no-deps lmms-eval
  touch .venv/.installed
fi
