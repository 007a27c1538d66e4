# Sourced by the scripts that start daemons (scripts/slurm/up.sh, scripts/postgres/up.sh): close every file
# the caller left open beyond stdin, stdout and stderr, so no daemon inherits it. Run under
# `flock /tmp/idmctl-slurm.lock scripts/test.sh`, munged inherited the lock's descriptor and held the lock
# for as long as it ran: every later `flock` waited on a daemon. Bash's own script descriptor (255) stays.
for _fd_path in /proc/$$/fd/*; do
  _fd=${_fd_path##*/}
  if [[ $_fd =~ ^[0-9]+$ ]] && (( _fd > 2 && _fd < 255 )); then eval "exec $_fd>&-" 2>/dev/null || true; fi
done
unset _fd _fd_path
