#!/usr/bin/env bash
# Debian packages the test suite needs: Slurm (+ munge), slurmdbd + MariaDB for real accounting,
# Chromium for the MLflow UI check, PostgreSQL for the shared-store tests (scripts/postgres/up.sh). Idempotent: installs only what is missing.
set -euo pipefail
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server chromium postgresql)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
# Postinst scripts must not start services (no systemd here; the project starts its own daemons).
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  created_policy=1
fi
export DEBIAN_FRONTEND=noninteractive
apt_install() { $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"; }
apt_install >/tmp/idmctl-apt.log 2>&1 || { $SUDO apt-get -o DPkg::Lock::Timeout=300 update -q >>/tmp/idmctl-apt.log 2>&1; apt_install >>/tmp/idmctl-apt.log 2>&1; } \
  || { tail -20 /tmp/idmctl-apt.log >&2; exit 1; }
[ "$created_policy" = 1 ] && $SUDO rm -f /usr/sbin/policy-rc.d
echo "system_deps: installed ${missing[*]}"
