# Sourced by scripts/demo and scripts/test: create or reuse .venv and install vidsight into it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Reinstall only when the dependency list changed since the last install.
if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
  touch .venv/.installed
fi
