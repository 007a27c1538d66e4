#!/usr/bin/env bash
# The Debian packages each README command needs; installs only what is missing (apt-get, as root or
# through sudo). Each command calls it for itself:
#
#   scripts/system_deps.sh quickstart   # scripts/quickstart.sh: offscreen rendering of the robosuite camera
#   scripts/system_deps.sh test         # scripts/test.sh: the quickstart's packages (the suite runs it), a
#                                       #   two-node Slurm with real accounting, Chromium for the MLflow UI test
#   scripts/system_deps.sh --list test  # print a group's packages, one a line, and install nothing
#
# quickstart: libegl1 + libegl-mesa0 (EGL through glvnd, Mesa's vendor library with the device platform
#   MuJoCo uses headless), libgl1-mesa-dri (llvmpipe, the CPU rasteriser), libopengl0 (the GL entry points
#   PyOpenGL and MuJoCo load); plus python3.11-venv when the Python that builds .venv is Debian's and
#   lacks venv/ensurepip.
# test: munge, slurmctld, slurmd, slurm-client, slurmdbd, mariadb-server, chromium, postgresql (the shared
#   store tests: scripts/postgres/up.sh), fio (the benchmarks' disk reference: bench/fio.py reads the same
#   byte ranges as each cache reader; tests/bench/test_bench_fio.py and `python -m bench.run`).
set -euo pipefail
QUICKSTART=(libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0)
TEST=("${QUICKSTART[@]}" munge slurmctld slurmd slurm-client slurmdbd mariadb-server chromium postgresql fio)

list=0
[[ ${1:-} == --list ]] && { list=1; shift; }
group=${1:-test}
case $group in
  quickstart) PACKAGES=("${QUICKSTART[@]}") ;;
  test) PACKAGES=("${TEST[@]}") ;;
  *) echo "system_deps: unknown group '$group' (quickstart or test)" >&2; exit 2 ;;
esac
# Debian's own Python builds .venv only with its venv package (pyenv/python.org builds carry it).
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
python_path=$(command -v "$PYTHON" || true)
if [[ $python_path == /usr/bin/* ]] && ! "$PYTHON" -c "import ensurepip, venv" >/dev/null 2>&1; then
  PACKAGES+=("python3-venv" "$(basename "$(readlink -f "$python_path")")-venv")
fi
if [[ $list == 1 ]]; then printf '%s\n' "${PACKAGES[@]}"; exit 0; fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
command -v apt-get >/dev/null 2>&1 || {
  echo "system_deps: missing ${missing[*]} and no apt-get here: install them with this system's package manager" >&2
  exit 1
}
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "system_deps: missing ${missing[*]}: run as root (or install sudo)" >&2; exit 1; }
  SUDO="sudo"
fi
# Postinst scripts must not start services (no systemd here; the project starts its own daemons).
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  created_policy=1
fi
trap '[ "$created_policy" = 1 ] && $SUDO rm -f /usr/sbin/policy-rc.d' EXIT
export DEBIAN_FRONTEND=noninteractive
log=${TMPDIR:-/tmp}/idmctl-apt.log
apt_install() { $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"; }
apt_install >"$log" 2>&1 || { $SUDO apt-get -o DPkg::Lock::Timeout=300 update -q >>"$log" 2>&1; apt_install >>"$log" 2>&1; } \
  || { tail -20 "$log" >&2; echo "system_deps: apt-get could not install ${missing[*]} (full log: $log)" >&2; exit 1; }
echo "system_deps: installed ${missing[*]}"
