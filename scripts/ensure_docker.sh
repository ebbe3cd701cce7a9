#!/usr/bin/env bash
# Make sure a Docker engine answers, and that debootstrap is there to build the sandbox images offline.
# As root on Debian with no engine running: install Debian's docker.io and start dockerd in the background.
set -euo pipefail

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)

engine_up() { docker info >/dev/null 2>&1; }

# crun (Debian's, written in C) starts containers with less CPU than runc; registered with dockerd as the runtime
# `crun`, chosen per run with `gagar eval --runtime crun` (sandbox.runtime in trainer configs). Best effort: a
# failure here leaves runc in use and is reported, never fatal. Root only; dockerd re-reads `runtimes` on SIGHUP,
# so running containers are not touched.
register_crun() {
  [ "$(id -u)" = 0 ] || return 0
  [ "${GAGAR_NO_CRUN:-}" = 1 ] && return 0
  if ! command -v crun >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq crun >/dev/null 2>&1 || { echo "docker: crun not installed (apt-get failed); runc stays" >&2; return 0; }
  fi
  # crun refuses a cgroup v1 host whose v2 hierarchy holds controllers ("hybrid"); controllers nothing uses
  # there (empty subtree_control) are mounted as v1 hierarchies instead, as runc already treats them.
  local v2=/sys/fs/cgroup/unified
  if [ -f "$v2/cgroup.controllers" ] && [ -z "$(cat "$v2/cgroup.subtree_control" 2>/dev/null)" ]; then
    for ctl in $(cat "$v2/cgroup.controllers"); do
      mountpoint -q "/sys/fs/cgroup/$ctl" && continue
      mkdir -p "/sys/fs/cgroup/$ctl" && mount -t cgroup -o "$ctl" cgroup "/sys/fs/cgroup/$ctl" 2>/dev/null \
        || echo "docker: could not mount the $ctl cgroup controller as v1; crun may refuse this host" >&2
    done
  fi
  if ! docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"crun"'; then
    local cfg=/etc/docker/daemon.json
    mkdir -p /etc/docker
    python3 - "$cfg" "$(command -v crun)" <<'PY'
import json, os, sys
path, crun = sys.argv[1], sys.argv[2]
data = json.load(open(path)) if os.path.exists(path) and open(path).read().strip() else {}
data.setdefault("runtimes", {})["crun"] = {"path": crun}
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(data, f, indent=2)
os.replace(tmp, path)
PY
    kill -HUP "$(cat /var/run/docker.pid 2>/dev/null)" 2>/dev/null || echo "docker: could not signal dockerd to reload; restart it to use crun" >&2
    for _ in $(seq 1 20); do
      docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"crun"' && break
      sleep 0.5
    done
  fi
  local img
  img=$(docker images --format '{{.Repository}}:{{.Tag}}' 'gagar-python' 2>/dev/null | head -1)
  if [ -n "$img" ] && ! docker run --rm --runtime crun --network none --memory 64m --pids-limit 64 --read-only \
      --cap-drop ALL --security-opt no-new-privileges --user 1000:1000 "$img" true >/dev/null 2>&1; then
    echo "docker: crun is registered but cannot start a limited container here; use the default runtime" >&2
    return 0
  fi
  echo "docker: runtime crun registered (use: gagar eval --runtime crun)"
}

if engine_up && [ ${#need_apt[@]} -eq 0 ]; then
  echo "docker: engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
  register_crun
  exit 0
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "docker: missing ${need_apt[*]}; install them (as root: apt-get install ${need_apt[*]}) and re-run" >&2
    engine_up && exit 0 || exit 1
  fi
  echo "docker: installing ${need_apt[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! engine_up; then
  if [ "$(id -u)" != 0 ]; then
    echo "docker: no engine answers and this is not root; start dockerd or set DOCKER_HOST" >&2
    exit 1
  fi
  echo "docker: starting dockerd (log: /var/log/gagar-dockerd.log)"
  setsid nohup dockerd >/var/log/gagar-dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 60); do
    engine_up && break
    sleep 1
  done
fi
if ! engine_up; then
  echo "docker: dockerd did not answer within 60 s; see /var/log/gagar-dockerd.log" >&2
  tail -n 20 /var/log/gagar-dockerd.log >&2 || true
  exit 1
fi
echo "docker: engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
register_crun
