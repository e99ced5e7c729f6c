#!/usr/bin/env bash
# Bench-only environment for benches/recommend_vs_aiconfigurator.py: NVIDIA's
# aiconfigurator (PyPI, Apache-2.0) 0.12.0 in its own venv. It is never a dependency of
# tokenyard: the project's .venv holds aiconfigurator-core (the measured tables) only.
#
#   bash benches/peers/aic_setup.sh            # create or refresh <repo>/.venv-aic
#   AIC_VENV=/elsewhere bash ...               # another location
#
# Idempotent: a re-run checks the installed version (~1 s). The venv is listed in
# .git/info/exclude (local to this checkout), not .gitignore, as vidur_setup.sh does.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${AIC_VENV:-$REPO/.venv-aic}"
PY="$VENV/bin/python"
AIC_VERSION=0.12.0

log() { printf '[aic-setup] %s\n' "$*"; }
installed_version() {
  "$PY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true
}

EXCLUDE="$(cd "$REPO" && git rev-parse --git-path info/exclude 2>/dev/null || true)"
if [[ -n "$EXCLUDE" && "$VENV" == "$REPO/"* ]]; then
  [[ "$EXCLUDE" = /* ]] || EXCLUDE="$REPO/$EXCLUDE"
  ENTRY="/${VENV#"$REPO/"}/"
  mkdir -p "$(dirname "$EXCLUDE")"
  if ! grep -qxF "$ENTRY" "$EXCLUDE" 2>/dev/null; then
    echo "$ENTRY" >>"$EXCLUDE"
    log "added $ENTRY to $EXCLUDE"
  fi
fi

if [[ ! -x "$PY" ]]; then
  log "creating $VENV"
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
  "$PY" -m pip --disable-pip-version-check -q install --upgrade pip
fi
if [[ "$(installed_version aiconfigurator)" != "$AIC_VERSION" ]]; then
  log "installing aiconfigurator==$AIC_VERSION and its declared dependencies"
  "$PY" -m pip --disable-pip-version-check -q install "aiconfigurator==$AIC_VERSION"
else
  log "aiconfigurator $AIC_VERSION present"
fi
log "ready: $VENV/bin/aiconfigurator (aiconfigurator $(installed_version aiconfigurator))"
