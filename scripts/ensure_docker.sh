#!/usr/bin/env bash
# Make sure a Docker engine answers, and that debootstrap is there to build the sandbox images offline.
# As root on Debian with no engine running: install Debian's docker.io and start dockerd in the background.
set -euo pipefail

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)

engine_up() { docker info >/dev/null 2>&1; }

if engine_up && [ ${#need_apt[@]} -eq 0 ]; then
  echo "docker: engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
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
